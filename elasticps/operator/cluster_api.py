"""The few Kubernetes API calls a pass makes, over the official ``kubernetes`` client, as plain JSON.

Callers: ``reconciling`` (reads) and ``executing`` (writes). Objects travel as dicts, exactly as
the API server sends them (no model classes: the planner and ``observing`` read camelCase JSON,
and decoding a pod list into models costs more than the request). The client brings what it is
good at: kubeconfig / in-cluster credentials, TLS, token refresh and connection pooling.

Outcomes the operator expects are values, not errors: a create answered 409 AlreadyExists returns
False (an earlier pass made it), a delete answered 404 NotFound or 409 (its uid precondition
failed: the pod was already replaced) returns False. Anything else raises :class:`ApiError`.
Every request is counted (``counting``), for the job whose pass is running.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes.client
import kubernetes.config

from elasticps.api.spec import GROUP, PLURAL, VERSION
from elasticps.operator.counting import OURS, RequestCounter, current_job
from elasticps.operator.manifests import LABEL_JOB

MERGE_PATCH = "application/merge-patch+json"
# The client is partly typed (and its generated layer re-validates every argument): used untyped here.
k8s: Any = kubernetes.client
k8s_config: Any = kubernetes.config


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes

    @property
    def namespace_terminating(self) -> bool:
        """Nothing can be created in a namespace being deleted; its job is about to go too."""
        return self.status == 403 and "NamespaceTerminating" in self.causes


def load_client_config() -> Any:
    """The in-cluster service account when there is one, else the kubeconfig (``$KUBECONFIG``)."""
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)
    return configuration


class ClusterApi:
    def __init__(self, configuration: Any, counter: RequestCounter, timeout_s: float = 30.0) -> None:
        self._client: Any = k8s.ApiClient(configuration)
        self._client.user_agent = "elasticps-operator"
        self._timeout_s = timeout_s
        rest = self._client.rest_client
        send: Callable[..., Any] = rest.request

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            counter.record(OURS, method, url, current_job.get())
            return send(method, url, *args, **kwargs)

        rest.request = counted

    def close(self) -> None:
        self._client.close()

    # ---- reads ---------------------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = self._call("GET", _job_path(namespace, name))
        if status == 404:
            return None
        return self._ok(status, body)

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self._list(_collection(namespace, "pods"), job)

    def list_services(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self._list(_collection(namespace, "services"), job)

    def list_network_policies(self, namespace: str, job: str) -> list[dict[str, Any]] | None:
        """The job's NetworkPolicies; None when the operator may not list them (403: no RBAC rule)."""
        try:
            return self._list(_collection(namespace, "networkpolicies"), job)
        except ApiError as err:
            if err.status == 403:
                return None
            raise

    def _list(self, path: str, job: str) -> list[dict[str, Any]]:
        status, body = self._call("GET", path, query=[("labelSelector", f"{LABEL_JOB}={job}")])
        items = self._ok(status, body).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    # ---- writes --------------------------------------------------------------------------------------
    def create(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        """Creates a core/v1 object (``pods``, ``services``, ``events``) or a ``networkpolicies`` one
        (networking.k8s.io/v1); False when it already exists."""
        status, body = self._call("POST", _collection(namespace, plural), body=manifest)
        if status == 409:
            return False
        self._ok(status, body)
        return True

    def delete_pod(self, namespace: str, name: str, uid: str = "") -> bool:
        """Deletes the pod (only the one with ``uid``, when given); False when it was already gone."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        status, body = self._call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=options)
        if status in (404, 409):
            return False
        self._ok(status, body)
        return True

    def patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """Applies ``patch``, a JSON merge patch of ``.status``; False when the job is gone."""
        status, body = self._call(
            "PATCH", _job_path(namespace, name) + "/status", body={"status": patch}, content_type=MERGE_PATCH
        )
        if status == 404:
            return False
        self._ok(status, body)
        return True

    def delete_job(self, namespace: str, name: str) -> bool:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        status, body = self._call("DELETE", _job_path(namespace, name), body=options)
        if status == 404:
            return False
        self._ok(status, body)
        return True

    # ---- plumbing ------------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self._client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self._client.call_api(*request, _request_timeout=self._timeout_s)
        response.read()
        raw = response.data or b"{}"
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = {"message": raw[:200].decode(errors="replace")}
        return int(response.status), decoded if isinstance(decoded, dict) else {}

    @staticmethod
    def _ok(status: int, body: dict[str, Any]) -> dict[str, Any]:
        if 200 <= status < 300:
            return body
        details = body.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        reasons = tuple(str(c.get("reason")) for c in causes if isinstance(c, dict)) if isinstance(causes, list) else ()
        raise ApiError(status, str(body.get("reason") or ""), str(body.get("message") or body), reasons)


def _collection(namespace: str, plural: str) -> str:
    if plural == "networkpolicies":
        return f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    return f"/api/v1/namespaces/{namespace}/{plural}"


def _job_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
