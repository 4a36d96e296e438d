"""``elasticps ps``: flags -> a frozen config -> one PS shard serving gRPC until stopped.

PS 0 also serves the coordinator (tasks, progress, evaluation), so a job is PS pods plus worker
pods. A restarted PS restores its newest good checkpoint before it serves. SIGTERM stops it after
in-flight calls (2 s grace) and the pending checkpoint writes; a sync shard with checkpoints also
writes one of the version it stops at (PS 0 its ledger beside it).
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import threading
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from prometheus_client import REGISTRY, start_http_server

from elasticps import allocator, identity
from elasticps.api.row_policy import RowPolicies
from elasticps.api.context import RoleContext, add_job_flags, context_from_args
from elasticps.api.modes import UpdateRule
from elasticps.api.replicas import Role
from elasticps.coordinator.journal import Journals
from elasticps.coordinator.local_steps import LocalSteps
from elasticps.coordinator.rounds import Rounds
from elasticps.coordinator.curves import open_curves
from elasticps.coordinator.bulk import BulkJoins
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.servicer import CoordinatorServicer
from elasticps.coordinator.servicer import add_to_server as add_coordinator
from elasticps.coordinator.shards import LedgerView, RemoteShard, ShardLink, ShardRefused, Shards, ShardView, TaskAdvance
from elasticps.coordinator.settings import queue_settings
from elasticps.data.readers import DataError
from elasticps.exits import user_error
from elasticps.files import write_atomically
from elasticps.ps.bulk import BulkServer
from elasticps.ps.checkpoint import CheckpointError
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.applied import TaskProgress
from elasticps.ps.servicer import ParameterServerServicer, ledger_message, shard_state
from elasticps.ps.servicer import add_to_server as add_ps_to_server
from elasticps.ps.store import ParameterStore, RoundError, StoreSettings, UninitializedError
from elasticps.rpc.channels import bind
from elasticps.rpc.health import add_async_health
from elasticps.rpc.limits import ServerLimits
from elasticps.rpc.serving import WORK_THREADS, AsyncServer
from elasticps.rpc.frames import CHUNK_BYTES
from elasticps.storage import OutputError, check_output

log = logging.getLogger(__name__)

ROUND_LOG_ENV = "ELASTICPS_ROUND_LOG"


@dataclass(frozen=True)
class PSConfig:
    job: RoleContext  # the job, and which shard this is (job.index; 0 also coordinates)
    num_ps: int
    host: str
    port: int
    port_file: str
    ps_addrs: tuple[str, ...]  # PS 0: every shard's address, in order (it coordinates sync rounds)
    rpc_threads: int
    metrics_port: int
    chunk_bytes: int = CHUNK_BYTES  # payload bytes per pulled frame (docs/benchmarks.md compares sizes)
    limits: ServerLimits = ServerLimits()  # calls in flight, stream deadlines and sizes (rpc/limits.py)
    bulk_port: int = 0  # the raw-TCP tensor channel (ps/bulk.py): 0 any free port, -1 off


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ps_id", type=int, default=0, help="this shard's index (0 also coordinates)")
    parser.add_argument("--num_ps", type=int, default=1, help="number of PS shards")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=2222, help="port to listen on (0: any free port)")
    parser.add_argument("--port_file", default="", help="write the bound port to this file once serving")
    parser.add_argument(
        "--ps_addrs", default="", help="PS 0 with several shards: every shard's host:port, comma-separated, in order"
    )
    parser.add_argument(
        "--rpc_threads",
        type=int,
        default=WORK_THREADS,
        help=f"threads that do the calls' work (updates, encoding pulls, the coordinator's decisions); a waiting "
        f"call (a long poll, a stream being received) holds none (default: {WORK_THREADS})",
    )
    add_limit_flags(parser)
    parser.add_argument(
        "--bulk_port", type=int, default=0,
        help="port of the raw-TCP tensor channel for pushes and pulls (0: any free port, -1: off; ps/bulk.py)",
    )  # fmt: skip
    allocator.add_flag(parser)
    parser.add_argument("--metrics_port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    parser.add_argument(
        "--chunk_bytes", type=int, default=CHUNK_BYTES, help="tensor bytes per streamed frame of a pull (default: 1 MiB)"
    )
    # PS 0 opens the data to cut it into tasks (the prediction data too), and exports at the end
    add_job_flags(
        parser,
        "PS 0: the job's output (spec.output); the final model is exported there, the training curves go to its tensorboard/",
    )


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The bounds that keep a job from starving its PS (``rpc/limits.py``; docs/architecture.md)."""
    d = ServerLimits()
    parser.add_argument(
        "--max_push_streams", type=int, default=d.max_push_streams,
        help=f"push calls (PushGradients, PushModel) in flight at once; more are answered RESOURCE_EXHAUSTED and "
        f"retried by the client (default: {d.max_push_streams})",
    )  # fmt: skip
    parser.add_argument(
        "--max_long_polls", type=int, default=d.max_long_polls,
        help=f"waiting pulls, and waiting joins on PS 0, at once (each); more are answered RESOURCE_EXHAUSTED "
        f"(default: {d.max_long_polls})",
    )  # fmt: skip
    parser.add_argument(
        "--stream_idle_seconds", type=float, default=d.stream_idle_s,
        help=f"a push stream that sends no frame for this long is ended DEADLINE_EXCEEDED, nothing applied "
        f"(default: {d.stream_idle_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--stream_deadline_seconds", type=float, default=d.stream_deadline_s,
        help=f"a push stream still open this long after it began is ended DEADLINE_EXCEEDED "
        f"(default: {d.stream_deadline_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--max_model_bytes", type=int, default=d.max_model_bytes,
        help=f"the most tensor bytes a PushModel may declare while the shard holds no model; once it holds one, "
        f"a stream may carry its model's bytes and headroom (default: {d.max_model_bytes}, 16 GiB)",
    )  # fmt: skip


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    try:
        return ServerLimits(
            max_push_streams=args.max_push_streams,
            max_long_polls=args.max_long_polls,
            stream_idle_s=args.stream_idle_seconds,
            stream_deadline_s=args.stream_deadline_seconds,
            max_model_bytes=args.max_model_bytes,
        )
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def config_from_args(args: argparse.Namespace) -> PSConfig:
    if not 0 <= args.ps_id < args.num_ps:
        raise SystemExit(f"error: --ps_id {args.ps_id} is not in [0, --num_ps {args.num_ps})")
    ps_addrs = tuple(a for a in args.ps_addrs.split(",") if a)
    if args.ps_id == 0 and args.num_ps > 1 and len(ps_addrs) != args.num_ps:
        raise SystemExit(f"error: --ps_addrs: PS 0 coordinates {args.num_ps} shards and needs all their addresses")
    if args.chunk_bytes < 1:
        raise SystemExit(f"error: --chunk_bytes must be >= 1, got {args.chunk_bytes}")
    if args.rpc_threads < 1:
        raise SystemExit(f"error: --rpc_threads must be >= 1, got {args.rpc_threads}")
    if args.malloc_arenas < 0:  # applied already, before the imports (cli.main)
        raise SystemExit(f"error: --malloc_arenas must be >= 0, got {args.malloc_arenas}")
    return PSConfig(
        job=context_from_args(args, Role.PS, args.ps_id),
        num_ps=args.num_ps,
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        ps_addrs=ps_addrs,
        rpc_threads=args.rpc_threads,
        metrics_port=args.metrics_port,
        chunk_bytes=args.chunk_bytes,
        limits=limits_from_args(args),
        bulk_port=args.bulk_port,
    )


def store_settings(config: PSConfig) -> StoreSettings:
    t = config.job.training
    return StoreSettings(
        shard=config.job.index,
        mode=config.job.mode,
        sync_version_tolerance=t.sync_version_tolerance,
        checkpoint_dir=Path(t.checkpoint_dir) if t.checkpoint_dir else None,
        checkpoint_steps=t.checkpoint_steps,
        keep_checkpoint_max=t.keep_checkpoint_max,
        checkpoint_full_every=t.checkpoint_full_every,
        round_log=_round_log(config.job.index),
        row_policies=RowPolicies.parse(t.embedding_policy),
    )


def _round_log(shard: int) -> Path | None:
    """``ELASTICPS_ROUND_LOG=DIR``: every sync commit's minibatches go to DIR/ps-<shard>.jsonl (audits)."""
    directory = os.environ.get(ROUND_LOG_ENV)
    return Path(directory) / f"ps-{shard}.jsonl" if directory else None


class LocalShard:
    """PS 0's own shard as the coordinator sees every shard (``coordinator.shards.ShardLink``)."""

    def __init__(self, store: ParameterStore, metrics: PSMetrics | None = None) -> None:
        self._store = store
        self._metrics = metrics

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        progress = [TaskProgress(t.epoch, t.first, t.reached, t.task_id) for t in tasks]
        try:
            return self._store.commit(round_, workers, dry_run, progress, restorable).version
        except (RoundError, UninitializedError) as err:
            raise ShardRefused(0, str(err)) from err

    def read_ledger(self) -> LedgerView:
        return LedgerView.of(ledger_message(self._store.applied.copy()))

    def describe(self) -> ShardView:
        return ShardView.of(shard_state(self._store, self._metrics))

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        try:
            self._store.roll_back(version, incarnation)
        except CheckpointError as err:
            raise ShardRefused(0, str(err)) from err
        return self.describe()


def rounds_and_shards(
    config: PSConfig, store: ParameterStore, stopping: threading.Event, metrics: PSMetrics | None = None
) -> tuple[Rounds | None, Shards]:
    """PS 0's view of the job's shards, and rounds over them unless the job is asynchronous (sync
    and LocalSGD have rounds; LocalSGD's also decide each worker's next period)."""
    links: list[ShardLink] = [LocalShard(store, metrics)]
    links += [RemoteShard(i, address, stopping) for i, address in enumerate(config.ps_addrs) if i > 0]
    t = config.job.training
    mode = config.job.mode
    if not mode.rounds:
        return None, Shards(links)
    periods = LocalSteps(mode.local_sgd) if mode.rule is UpdateRule.LOCAL_SGD else None
    rounds = Rounds(
        grads_to_wait=t.grads_to_wait, tolerance=t.sync_version_tolerance, version=store.version, periods=periods
    )
    return rounds, Shards(links)


def run(config: PSConfig) -> int:
    try:
        verifier = identity.key_from_env()
    except identity.IdentityError as err:
        return user_error(f"ps-{config.job.index}", err)
    store = ParameterStore(store_settings(config))
    if store.restore():
        log.info("PS %d resumes at version %d%s", config.job.index, store.version, _rows_line(store))
    server = AsyncServer(config.rpc_threads, verifier)
    metrics = PSMetrics(REGISTRY, config.job.index)
    metrics.model_version.set(store.version)
    metrics.watch_rows(store.row_stats)
    servicer = ParameterServerServicer(store, config.chunk_bytes, metrics, config.limits)
    add_ps_to_server(servicer, server)
    stopped = threading.Event()  # set by SIGTERM/SIGINT: retries of dead shards give up at once
    coordinator: Coordinator | None = None
    if config.job.index == 0:
        try:
            settings = queue_settings(config.job.data, config.job.training, config.job.prediction, config.job.output)
            if config.job.output:
                check_output(config.job.output)
        except (DataError, OutputError) as err:
            server.stop(grace=None).wait()
            return user_error("ps-0", err)
        journal = Path(config.job.training.checkpoint_dir) / "coordinator.json" if config.job.training.checkpoint_dir else None
        rounds, shards = rounds_and_shards(config, store, stopped, metrics)
        t = config.job.training
        journals = Journals(Path(t.checkpoint_dir) / "coordinator", 2 * t.keep_checkpoint_max) if t.checkpoint_dir else None
        coordinator = Coordinator(
            settings,
            version_fn=lambda: store.version,
            journal=journal,
            rounds=rounds,
            shards=shards,
            journals=journals,
            checkpoint_steps=t.checkpoint_steps,
            checkpoint_dir=t.checkpoint_dir,
            output=config.job.output,
            curves=(
                open_curves(config.job.output, metrics.staleness_counts, lambda: metrics.last_learning_rate)
                if config.job.output and settings.trains
                else None
            ),
            staleness=metrics.staleness_counts,
        )
        add_coordinator(CoordinatorServicer(coordinator, config.limits), server)
        coordinator.start()
    bulk_server: BulkServer | None = None
    if config.bulk_port >= 0:
        joiner = BulkJoins(coordinator) if coordinator is not None else None  # joins behind pushes to PS 0
        bulk_server = BulkServer(store, metrics, config.limits, config.host, config.bulk_port, joiner, verifier)
        servicer.bulk_port = bulk_server.port
        bulk_server.start()
    health = add_async_health(server)
    port = bind(server, config.host, config.port)
    if config.metrics_port:
        start_http_server(config.metrics_port, addr=config.host, registry=REGISTRY)
    server.start()
    health.serving()
    if config.port_file:
        write_atomically(Path(config.port_file), f"{port}\n")
    log.info("PS %d/%d serving on %s:%d", config.job.index, config.num_ps, config.host, port)

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
    if coordinator is not None:
        coordinator.stop()  # its ticker and waiting joins end now; the training curves are closed
    health.enter_graceful_shutdown()
    if bulk_server is not None:
        bulk_server.stop()
    server.stop(grace=2).wait()
    if config.job.mode.rounds:
        # Sync and LocalSGD: the model stands still once PS 0 stops committing rounds; a checkpoint
        # of it, beside PS 0's ledger (``SyncRounds.save_final``), is where a job stopped as a whole
        # resumes. (Async shards have no common version to stop at.)
        store.checkpoint_final()
    store.flush_checkpoints()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
    log.info("PS %d stops at version %d%s; peak resident memory %.0f MB", config.job.index, store.version,
             _rows_line(store), peak_mb)
    return 0


def _rows_line(store: ParameterStore) -> str:
    """", embedding rows held: {table: rows}, B bytes" for a shard with tables; "" otherwise."""
    held = store.rows_held()
    return f", embedding rows held: {held}, {store.embedding_bytes()} bytes" if held else ""

