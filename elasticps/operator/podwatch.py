"""The jobs' pods, watched: every change to a pod labelled ``elasticps.io/job-name`` asks for a pass of
its job. Only that: the pass lists the pods itself.

Callers: ``runtime`` starts one :class:`PodWatch` per watched namespace (one for the whole cluster
when it watches every namespace) and hands it ``on_pod(namespace, job, job_uid)``; with Kueue
admission on, one more per namespace over the jobs' Workloads (``resource``), so that an admission
or an eviction is acted on at once, not at the next resync.

Why not kopf's ``on.event`` for pods, as for TrainingJobs: kopf gives every event of every object its
full handling (a worker per object, handler matching, its logging), about 1.5 ms of the operator's
CPU per event; a 1,024-worker job makes some 4,000 pod events as it starts and 2,000 as it goes, all
on the thread that also sends its creates. Here an event costs a JSON decode and a dict lookup.

The protocol is the API's own (client-go's reflector): LIST (the labelled pods, server-filtered,
and the list's resourceVersion; each listed pod's job gets a pass), then WATCH from that version with
bookmarks, resumed from the last version seen whenever the server ends the stream (``timeout_s``);
``410 Gone`` (the version is too old) or any error (after ``retry_s``) starts again from a LIST.
Requests go through ``ClusterApi``: counted, and under the operator's rate limit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import urllib3

from elasticps.api.spec import GROUP, KIND
from elasticps.operator.cluster_api import ApiError, ClusterApi
from elasticps.operator.manifests import LABEL_JOB

log = logging.getLogger(__name__)

GONE = 410


def owner(labels: Mapping[str, Any], meta: Mapping[str, Any]) -> tuple[str, str]:
    """The TrainingJob a pod belongs to, as (name, uid): its controller reference, else its job-name
    label (uid unknown: "")."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return str(ref["name"]), str(ref.get("uid") or "")
    return str(labels.get(LABEL_JOB, "")), ""


class PodWatch:
    def __init__(
        self,
        api: ClusterApi,
        namespace: str | None,
        on_pod: Callable[[str, str, str], None],
        timeout_s: int = 300,
        retry_s: float = 1.0,
        resource: tuple[str, str] = ("v1", "pods"),
    ) -> None:
        self._api, self._namespace, self._on_pod = api, namespace, on_pod
        self._timeout_s, self._retry_s, self._resource = timeout_s, retry_s, resource
        self._stop = threading.Event()
        what = resource[1].removesuffix("s")
        self._thread = threading.Thread(target=self._run, name=f"elasticps {what} watch {namespace or '*'}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops at the next event or at the stream's end (the thread is a daemon: exit never waits)."""
        self._stop.set()

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    items, version = self._api.list_job_pods(self._namespace, self._resource)
                    for item in items:
                        self._notify(item)
                for kind, obj in self._api.watch_job_pods(self._namespace, version, self._timeout_s, self._resource):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":
                        if obj.get("code") != GONE:
                            log.warning("%s watch: %s", self._resource[1], obj.get("message") or obj)
                        version = ""  # list again
                        break
                    meta = obj.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        self._notify(obj)
            except (ApiError, OSError, urllib3.exceptions.HTTPError, ValueError) as err:
                log.warning("%s watch (%s): %s; again in %.0f s", self._resource[1], self._namespace or "all namespaces",
                            err, self._retry_s)
                version = ""
                self._stop.wait(self._retry_s)

    def _notify(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name, uid = owner(meta.get("labels") or {}, meta)
        if name:
            self._on_pod(str(meta.get("namespace") or "default"), name, uid)
