"""The few Kubernetes API calls a pass makes, over the official ``kubernetes`` client, as plain JSON.

Callers: ``reconciling`` (reads) and ``executing`` (writes). Objects travel as dicts, exactly as
the API server sends them (no model classes: the planner and ``observing`` read camelCase JSON,
and decoding a pod list into models costs more than the request). The client brings what it is
good at: kubeconfig / in-cluster credentials, TLS, token refresh and connection pooling.

Outcomes the operator expects are values, not errors: a create answered 409 AlreadyExists returns
False (an earlier pass made it), a delete answered 404 NotFound or 409 (its uid precondition
failed: the pod was already replaced) returns False. Anything else raises :class:`ApiError`.
Every request is counted (``counting``), for the job whose pass is running, and waits its turn at
the operator's client-side rate limit (``throttling``: QPS and burst, shared with kopf's requests).
The connection pool holds ``connections`` connections, enough for ``executing``'s concurrent creates.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import kubernetes.config

from elasticps.api.spec import GROUP, PLURAL, VERSION
from elasticps.operator.counting import OURS, RequestCounter, current_job
from elasticps.operator.manifests import LABEL_JOB
from elasticps.operator.throttling import RateLimiter

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
    def __init__(
        self,
        configuration: Any,
        counter: RequestCounter,
        timeout_s: float = 30.0,
        limiter: RateLimiter | None = None,
        connections: int = 16,
    ) -> None:
        configuration.connection_pool_maxsize = max(int(configuration.connection_pool_maxsize or 0), connections)
        self._client: Any = k8s.ApiClient(configuration)
        self._client.user_agent = "elasticps-operator"
        self._timeout_s = timeout_s
        self.limiter = limiter or RateLimiter(qps=0)
        rest = self._client.rest_client
        send: Callable[..., Any] = rest.request
        wait = self.limiter.wait

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            wait()
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

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret (a job's identity, ``operator/identities.py``); None when there is none."""
        status, body = self._call("GET", f"{_collection(namespace, 'secrets')}/{name}")
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

    def list_job_pods(
        self, namespace: str | None, resource: tuple[str, str] = ("v1", "pods")
    ) -> tuple[list[dict[str, Any]], str]:
        """Every pod (or other object of ``resource``, (apiVersion, plural): a job's Kueue Workload)
        any job labelled (in ``namespace``; None: every namespace) and the list's resourceVersion."""
        path = _collection(namespace, resource[1], resource[0]) if namespace else _cluster_collection(resource[1], resource[0])
        status, body = self._call("GET", path, query=[("labelSelector", LABEL_JOB)])
        listed = self._ok(status, body)
        items = listed.get("items")
        meta = listed.get("metadata")
        version = str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""
        return ([i for i in items if isinstance(i, dict)] if isinstance(items, list) else []), version

    def watch_job_pods(
        self, namespace: str | None, resource_version: str, timeout_s: int, resource: tuple[str, str] = ("v1", "pods")
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` of every change to those pods (or objects of ``resource``) after
        ``resource_version`` (ADDED, MODIFIED, DELETED, BOOKMARK; ERROR with a Status, e.g. 410 when
        that version is too old), until the server ends the stream after ``timeout_s`` (a silent
        connection is given up 30 s later)."""
        path = _collection(namespace, resource[1], resource[0]) if namespace else _cluster_collection(resource[1], resource[0])
        query = [
            ("labelSelector", LABEL_JOB), ("watch", "true"), ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version), ("timeoutSeconds", str(timeout_s)),
        ]  # fmt: skip
        request = self._client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = self._client.call_api(*request, _request_timeout=(self._timeout_s, timeout_s + 30))
        raw = response.response
        try:
            if response.status != 200:
                response.read()
                self._ok(int(response.status), json.loads(response.data or b"{}"))
            buffer = b""
            for chunk in raw.read_chunked(None, decode_content=True):  # each chunk as it arrives
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type")), event.get("object") or {}
        finally:
            raw.release_conn()

    def get(self, api_version: str, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """One object of any resource (``namespace`` empty: a cluster-scoped one, e.g. a Kueue
        ResourceFlavor); None when there is none."""
        path = f"{_collection(namespace, plural, api_version)}/{name}" if namespace else \
            f"{_cluster_collection(plural, api_version)}/{name}"
        status, body = self._call("GET", path)
        if status == 404:
            return None
        return self._ok(status, body)

    def _list(self, path: str, job: str) -> list[dict[str, Any]]:
        status, body = self._call("GET", path, query=[("labelSelector", f"{LABEL_JOB}={job}")])
        items = self._ok(status, body).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    # ---- writes --------------------------------------------------------------------------------------
    def create(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        """Creates a namespaced object of resource ``plural`` in the manifest's ``apiVersion`` (core/v1
        when it has none): ``pods``, ``services``, ``events``, ``networkpolicies``, a scheduling
        policy's ``podgroups`` ...; False when it already exists."""
        api_version = str(manifest.get("apiVersion") or "v1")
        status, body = self._call("POST", _collection(namespace, plural, api_version), body=manifest)
        if status == 409:
            return False
        self._ok(status, body)
        return True

    def patch_spec(self, namespace: str, plural: str, manifest: dict[str, Any]) -> bool:
        """Merges ``manifest``'s spec into the existing object of that name (a PodGroup's minMember as
        the job's size changed); False when it is gone."""
        api_version = str(manifest.get("apiVersion") or "v1")
        path = f"{_collection(namespace, plural, api_version)}/{manifest['metadata']['name']}"
        status, body = self._call("PATCH", path, body={"spec": manifest.get("spec", {})}, content_type=MERGE_PATCH)
        if status == 404:
            return False
        self._ok(status, body)
        return True

    def dry_run_pod(self, namespace: str, manifest: dict[str, Any]) -> str | None:
        """The API server's refusal of ``manifest`` as a pod, strictly decoded (an unknown field is an
        error, not dropped) and admitted without being stored (``dryRun=All``); None when it would
        take it. Only the pod's own fault counts: strict decoding (400) and invalid values (422); a
        name in use, a webhook that cannot dry-run or any other error is None (the real create says)."""
        query = [("dryRun", "All"), ("fieldValidation", "Strict")]
        status, body = self._call("POST", _collection(namespace, "pods"), query=query, body=manifest)
        message = str(body.get("message") or "")
        if status == 422 or (status == 400 and "strict decoding error" in message):
            return message
        return None

    def delete(self, namespace: str, plural: str, api_version: str, name: str) -> bool:
        """Deletes the namespaced object ``name`` of resource ``plural`` in ``api_version``; False when
        it was already gone."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        status, body = self._call("DELETE", f"{_collection(namespace, plural, api_version)}/{name}", body=options)
        if status == 404:
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

    def delete_pods(self, namespace: str, selector: str) -> None:
        """Deletes every pod ``selector`` matches with one request (a ``deletecollection``): the API
        server deletes them, each gracefully, instead of one request per pod."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        status, body = self._call(
            "DELETE", _collection(namespace, "pods"), query=[("labelSelector", selector)], body=options
        )
        if status != 404:
            self._ok(status, body)

    def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """Applies ``patch``, a JSON merge patch of the Secret; False when it is gone."""
        status, body = self._call("PATCH", f"{_collection(namespace, 'secrets')}/{name}", body=patch,
                                  content_type=MERGE_PATCH)
        if status == 404:
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

    def replace_status(self, namespace: str, plural: str, obj: dict[str, Any]) -> bool:
        """Writes ``obj``'s ``.status`` (PUT of the status subresource, guarded by the object's
        resourceVersion: a 409 means someone wrote it since it was read, and the next pass reads it
        again). False when the object is gone or was changed meanwhile."""
        api_version = str(obj.get("apiVersion") or "v1")
        name = str(obj["metadata"]["name"])
        status, body = self._call("PUT", f"{_collection(namespace, plural, api_version)}/{name}/status", body=obj)
        if status in (404, 409):
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


def _collection(namespace: str, plural: str, api_version: str = "v1") -> str:
    """The path of a namespaced collection: core/v1 (``v1``) under /api, any other group under /apis."""
    if plural == "networkpolicies":
        api_version = "networking.k8s.io/v1"
    if api_version == "v1":
        return f"/api/v1/namespaces/{namespace}/{plural}"
    return f"/apis/{api_version}/namespaces/{namespace}/{plural}"


def _cluster_collection(plural: str, api_version: str) -> str:
    """The path of a cluster-scoped collection."""
    return f"/api/v1/{plural}" if api_version == "v1" else f"/apis/{api_version}/{plural}"


def _job_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
