"""The kopf handlers: thin triggers for the work queue, nothing decided here.

Run with ``elasticps operator`` (which imports this module and runs kopf with a typed config), or
``kopf run -m elasticps.operator.handlers --all-namespaces`` (defaults). Every handler only says
"job J needs a pass"; the pass (``reconciling``) reads, plans (``elasticps.planning``), renders
(``rendering``) and acts (``executing``):

- TrainingJob created, resumed (operator start) or changed (``spec``; ``kubectl scale`` goes through
  the scale subresource to ``spec.worker.replicas``) -> a pass of that job;
- any event of a pod labelled ``elasticps.io/job-name`` -> a pass of its owner (watched by
  ``podwatch``, not kopf: see there why);
- a TrainingJob deleted -> its queue entry and coordinator channel are dropped, and its pods deleted
  with one request (a deletecollection by the job's uid label; no finalizer: garbage collection
  deletes the rest, and the pods too if the operator is down, through their ownerReferences);
- on top, each job gets a pass after ``resync_s`` without one (``queueing``).

kopf's own bookkeeping goes into annotations (``elasticps.io/...``), not into ``.status``: the CRD
declares every status field, so the API server would prune kopf's ``status.kopf``. Its watch
requests carry both a server-side and a client-side timeout, so a silently dropped connection
cannot stall the operator (kopf's known watch hang). Only kopf's warnings become Events.
kopf's requests are counted and wait at the same client-side rate limit as ours (``throttling``).
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import kopf

from elasticps.api.spec import GROUP, PLURAL, VERSION
from elasticps.operator.config import OperatorConfig
from elasticps.operator.counting import KOPF, RequestCounter
from elasticps.operator.runtime import OperatorRuntime

log = logging.getLogger(__name__)

WATCH_SERVER_TIMEOUT_S = 300
WATCH_CLIENT_TIMEOUT_S = 330
ANNOTATION_PREFIX = GROUP


def _runtime(memo: Any) -> OperatorRuntime:
    runtime: OperatorRuntime = memo["runtime"]
    return runtime


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = memo.get("config") or OperatorConfig()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = config.request_timeout_s
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    runtime = OperatorRuntime(config, RequestCounter())
    runtime.start()
    memo["runtime"] = runtime
    scope = ", ".join(config.namespaces) or "all namespaces"
    log.info("elasticps operator: watching %s; coordinators at %s; job pods pull %s", scope,
             config.coordinator_for("NAMESPACE", "JOB", "JOB-ps-0"), config.rendering.pull_policy)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    if "runtime" in memo:
        await _runtime(memo).close()


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.AiohttpSession | kopf.ConnectionInfo | None:
    """kopf's own credentials (the same kubeconfig or service account as ours), in a session whose
    requests are counted too (kopf's documented custom-session hook)."""
    info = kopf.login_via_client(**kwargs)
    if info is None or "runtime" not in memo:
        return info
    counter = _runtime(memo).counter
    limiter = _runtime(memo).limiter

    async def on_request_start(_session: Any, _ctx: Any, params: aiohttp.TraceRequestStartParams) -> None:
        await limiter.wait_async()
        counter.record(KOPF, params.method, str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    auth = info.as_aiohttp_basic_auth()  # None with a token, as in a kubeconfig or a service account
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        trace_configs=[trace],
        trust_env=info.trust_env,
        auth=auth,
    )
    return kopf.AiohttpSession(
        aiohttp_session=session,
        server=info.server,
        default_namespace=info.default_namespace,
        expiration=info.expiration,
        priority=info.priority,
    )


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def job_changed(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    _runtime(memo).request(namespace or "default", name)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(type: str, namespace: str | None, name: str, meta: kopf.Meta, memo: Any, **_: Any) -> None:
    if type == "DELETED":
        runtime = _runtime(memo)
        runtime.forget(namespace or "default", name, meta.uid or "")
        if meta.uid:
            await runtime.delete_pods(namespace or "default", name, meta.uid)
