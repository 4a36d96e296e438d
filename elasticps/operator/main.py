"""``elasticps operator``: flags -> a frozen :class:`OperatorConfig` -> kopf running our handlers.

The same as ``kopf run -m elasticps.operator.handlers --all-namespaces --standalone`` (module mode,
never file mode: see DESIGN.md), with the config passed to the handlers as kopf's operator memo
instead of being read from the environment. Stops on SIGINT/SIGTERM (kopf's own handling).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from elasticps.api.spec import PULL_POLICIES
from elasticps.operator.config import DEFAULT_COORDINATOR_ADDRESS, OperatorConfig
from elasticps.operator.executing import DEFAULT_CONCURRENCY
from elasticps.operator.manifests import DEFAULT_PULL_POLICY
from elasticps.operator.rendering import Renderer
from elasticps.operator.rotation import DEFAULT_GRACE_S, DEFAULT_PERIOD_S, ROTATE_ANNOTATION, Policy
from elasticps.operator.throttling import DEFAULT_BURST, DEFAULT_QPS
from elasticps.planning.settings import PlannerSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: every namespace)",
    )
    parser.add_argument(
        "--coordinator_address",
        default=DEFAULT_COORDINATOR_ADDRESS,
        help="where a job's coordinator answers; {job}, {namespace} and {coordinator} (PS 0's or the "
        "coordinator replica's name) are filled in (default: %(default)s)",
    )
    parser.add_argument("--coordinator_timeout", type=float, default=1.0, help="seconds a pass waits for PS 0")
    parser.add_argument("--resync_seconds", type=float, default=10.0, help="a pass of every job at least this often")
    parser.add_argument(
        "--pending_timeout",
        type=float,
        default=600.0,
        help="seconds an unschedulable pod may stay pending before the job fails (0: forever)",
    )
    parser.add_argument("--stats_file", type=Path, default=None, help="write the API request counts here (JSON)")
    parser.add_argument(
        "--metrics_port", type=int, default=0, help="serve Prometheus metrics (reconcile passes, latency) here; 0: off"
    )
    parser.add_argument(
        "--kube_api_qps",
        type=float,
        default=DEFAULT_QPS,
        help="requests per second the operator may send to the API server, kopf's included (0: no limit; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--kube_api_burst", type=int, default=DEFAULT_BURST, help="requests it may send at once above that rate (default: %(default)s)"
    )
    parser.add_argument(
        "--kube_api_concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="creates or deletes of one job in flight at once (default: %(default)s)",
    )
    parser.add_argument(
        "--identity_rotation_hours",
        type=float,
        default=DEFAULT_PERIOD_S / 3600,
        help="rotate each running job's identity key when it is this old (0: only when a job's "
        f"{ROTATE_ANNOTATION} annotation changes; default: %(default)s)",
    )
    parser.add_argument(
        "--identity_grace_seconds",
        type=float,
        default=DEFAULT_GRACE_S,
        help="seconds between the steps of a key rotation: the kubelet's time to update a mounted Secret "
        "(default: %(default)s)",
    )
    parser.add_argument("--liveness", default="", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="watch the Kueue Workloads of queued jobs (kueue.x-k8s.io/queue-name), so that an admission or "
        "an eviction is acted on at once (needs list and watch on workloads; without: at each resync)",
    )
    parser.add_argument(
        "--image_pull_policy",
        default=DEFAULT_PULL_POLICY,
        choices=PULL_POLICIES,
        help="the job pods' imagePullPolicy where a TrainingJob names none (default: %(default)s, for an image "
        "built on the node)",
    )


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    for value, flag in ((args.coordinator_timeout, "--coordinator_timeout"), (args.resync_seconds, "--resync_seconds")):
        if value <= 0:
            raise SystemExit(f"error: {flag} must be > 0, got {value}")
    if args.kube_api_qps < 0:
        raise SystemExit(f"error: --kube_api_qps must be >= 0 (0: no limit), got {args.kube_api_qps}")
    for value, flag in ((args.kube_api_burst, "--kube_api_burst"), (args.kube_api_concurrency, "--kube_api_concurrency")):
        if value < 1:
            raise SystemExit(f"error: {flag} must be >= 1, got {value}")
    if args.identity_rotation_hours < 0 or args.identity_grace_seconds <= 0:
        raise SystemExit("error: --identity_rotation_hours must be >= 0 and --identity_grace_seconds > 0")
    try:
        args.coordinator_address.format(job="j", namespace="n", coordinator="c")
    except (KeyError, IndexError, ValueError) as err:
        raise SystemExit(f"error: --coordinator_address: only {{job}}, {{namespace}} and {{coordinator}} may be used ({err})") from None
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        coordinator_address=args.coordinator_address,
        coordinator_timeout_s=args.coordinator_timeout,
        resync_s=args.resync_seconds,
        stats_file=args.stats_file,
        metrics_port=args.metrics_port,
        kube_api_qps=args.kube_api_qps,
        kube_api_burst=args.kube_api_burst,
        kube_api_concurrency=args.kube_api_concurrency,
        planner=PlannerSettings(pending_timeout_s=args.pending_timeout if args.pending_timeout > 0 else None),
        rendering=Renderer(pull_policy=args.image_pull_policy),
        rotation=Policy(period_s=args.identity_rotation_hours * 3600, grace_s=args.identity_grace_seconds),
        kueue=args.kueue,
    )


def run(config: OperatorConfig, liveness: str = "") -> int:
    import kopf

    from elasticps.operator import handlers  # noqa: F401 - registers the handlers

    # kopf logs every handler call at INFO, aiohttp every liveness probe; ours say what matters.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        standalone=True,
        liveness_endpoint=liveness or None,
        memo=kopf.Memo(config=config),
    )
    return 0
