"""``elasticps worker``: flags -> a frozen config -> a Worker, run until the job is done.

The job's flags are parsed once, with the training mode (``api/context.py``); the Worker picks its
step from the mode. The model is built by the backend of ``--framework`` (``backends/registry.py``).
A job that predicts with an exported model (``--prediction_model``) has no training data: the
exported model is loaded here (a missing or unreadable one is a user error, exit 2).

Exit codes: 0 when the job is finished, 2 for a bad model module or bad data (a user error the
runner must not retry), 143 when stopped by SIGTERM (its task reported failed, so it is handed out
again at once; a signal's exit code is retried by every restart policy but Never), 1 for anything
else (retried per the restart policy). The handler matters in a container, where the worker is
PID 1 and the kernel would otherwise ignore SIGTERM until the kubelet's SIGKILL.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from elasticps import identity
from elasticps.api.context import RoleContext, add_job_flags, context_from_args
from elasticps.api.flags import add_decentralized_flags, decentralized_from_args
from elasticps.api.output import exported_job
from elasticps.api.replicas import Role
from elasticps.api.spec import DecentralizedSpec, Framework, ModelSpec, Strategy
from elasticps.exits import user_error
from elasticps.rpc.channels import bind, create_server
from elasticps.rpc.health import add_health, serving
from elasticps.worker.cpu import available_cpus, cpu_line, cpu_seconds
from elasticps.worker.exporting import Exporter
from elasticps.worker.pacing import pace_for

if TYPE_CHECKING:
    from elasticps.backends.api import BackendTrainer

log = logging.getLogger(__name__)

EXIT_STOPPED = 128 + signal.SIGTERM
# After SIGTERM: time to hand the task back and close the channels; then the process exits
# regardless (a PS that is gone too, as when a whole job is deleted, would keep the report retrying).
STOP_GRACE_S = 5.0
# After the worker is done: the longest the interpreter's own exit may take (it joins every thread
# a pool started) before the process ends with the worker's exit code anyway.
EXIT_GRACE_S = 15.0


@dataclass(frozen=True)
class WorkerConfig:
    job: RoleContext  # the job, and which worker this is (job.index)
    ps_addrs: tuple[str, ...]
    model: ModelSpec
    num_threads: int
    metrics_port: int
    health_port: int
    job_name: str = ""  # the job's name, for job.json
    strategy: Strategy = Strategy.PARAMETER_SERVER
    coordinator_addr: str = ""  # the coordinator (PS 0's address under the PS strategy)
    peer_addrs: tuple[str, ...] = ()  # decentralized: every worker's Peer service, in worker order
    peer_port: int = 0  # decentralized: this worker's Peer service port (0: its entry in peer_addrs)
    decentralized: DecentralizedSpec = DecentralizedSpec()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker_id", type=int, default=0, help="this worker's index")
    parser.add_argument(
        "--ps_addrs", default="", help="comma-separated host:port of every PS, shard order; PS 0 also coordinates"
    )
    parser.add_argument(
        "--strategy", default=Strategy.PARAMETER_SERVER.value, choices=[s.value for s in Strategy],
        help="parameterServer (--ps_addrs) or decentralized (--coordinator_addr, --peer_addrs)",
    )
    parser.add_argument("--coordinator_addr", default="", help="decentralized: the job's coordinator, host:port")
    parser.add_argument(
        "--peer_addrs", default="",
        help="decentralized: every worker's Peer service host:port, comma-separated, in worker order",
    )
    parser.add_argument(
        "--peer_port", type=int, default=0,
        help="decentralized: the port this worker's Peer service listens on (0: the port of its own --peer_addrs entry)",
    )
    parser.add_argument("--model_def", required=True, help="model module, e.g. elasticps.backends.keras.zoo.mnist_cnn")
    parser.add_argument(
        "--framework", default=Framework.KERAS.value, choices=[f.value for f in Framework],
        help="what the model module is written for (spec.model.framework)",
    )
    parser.add_argument("--model_params", default="{}", help="JSON object of keyword arguments for custom_model()")
    parser.add_argument(
        "--num_threads",
        type=int,
        default=0,
        help="threads of each TensorFlow pool (0: the CPUs this process may use: its affinity, capped by "
        "its cgroup's CPU quota, e.g. a pod's CPU limit; elasticps run gives each local worker its share)",
    )
    parser.add_argument("--metrics_port", type=int, default=0, help="serve Prometheus metrics on this port (0: off)")
    parser.add_argument(
        "--health_port", type=int, default=0, help="serve the gRPC health-checking service on this port (0: off)"
    )
    parser.add_argument("--job_name", default="", help="the job's name (written into an export's job.json)")
    add_job_flags(parser, "the job's output (spec.output): where exports are written")
    add_decentralized_flags(parser)


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    if args.num_threads < 0:
        raise SystemExit(f"error: --num_threads: must be >= 0, got {args.num_threads}")
    try:
        params = json.loads(args.model_params)
    except json.JSONDecodeError as err:
        raise SystemExit(f"error: --model_params: not JSON: {err}") from None
    if not isinstance(params, dict):
        raise SystemExit("error: --model_params: must be a JSON object")
    strategy = Strategy(args.strategy)
    addrs = tuple(a.strip() for a in args.ps_addrs.split(",") if a.strip())
    peers = tuple(a.strip() for a in args.peer_addrs.split(",") if a.strip())
    decentralized = decentralized_from_args(args)
    if strategy is Strategy.PARAMETER_SERVER and not addrs:
        raise SystemExit("error: --ps_addrs: no address")
    if strategy is Strategy.DECENTRALIZED:
        if not args.coordinator_addr:
            raise SystemExit("error: --coordinator_addr: required with --strategy decentralized")
        if not 0 <= args.worker_id < len(peers):
            raise SystemExit(f"error: --peer_addrs: {len(peers)} workers, no entry for --worker_id {args.worker_id}")
        try:
            decentralized.graph_for(len(peers))
        except ValueError as err:
            raise SystemExit(f"error: --graph: {err}") from None
    try:
        identity.key_from_env()  # a decentralized worker's peer service checks its callers with it
    except identity.IdentityError as err:
        raise SystemExit(f"error: {err}") from None
    job = context_from_args(args, Role.WORKER, args.worker_id)
    prediction = job.prediction
    if not args.training_data and not prediction.standalone:
        raise SystemExit("error: --training_data: required (unless --prediction_model and --prediction_data are given)")
    if prediction.enabled and not args.output:
        raise SystemExit("error: --prediction_data: needs --output (the predictions go to <output>/predictions/)")
    return WorkerConfig(
        job=job,
        ps_addrs=addrs,
        model=ModelSpec(model_def=args.model_def, framework=Framework(args.framework), params=params),
        num_threads=args.num_threads,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        job_name=args.job_name,
        strategy=strategy,
        coordinator_addr=args.coordinator_addr or (addrs[0] if addrs else ""),
        peer_addrs=peers,
        peer_port=args.peer_port,
        decentralized=decentralized,
    )


def run(config: WorkerConfig) -> int:
    from elasticps.worker.training import Stopped

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up below must not be interrupted
        stopping.set()
        raise Stopped(f"stopped by signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, stop)
    arm_stop_watchdog()
    code = 1  # a traceback on its way out
    try:
        code = _run_until_stopped(config, stopping)
        return code
    finally:
        arm_exit_watchdog(code)


def _run_until_stopped(config: WorkerConfig, stopping: threading.Event) -> int:
    from elasticps.worker.training import Stopped

    try:
        return _run(config, stopping)
    except Stopped:  # its message, raised inside a traced data function, may carry TensorFlow's trace
        log.info("worker-%d: stopped by signal SIGTERM", config.job.index)
        return EXIT_STOPPED
    except Exception as err:
        # Raised while TensorFlow binds a tf.function's inputs, Stopped comes out as its TypeError
        # ("Binding inputs to tf.function failed due to `stopped by signal SIGTERM`"): still a stop.
        if not stopping.is_set():
            raise
        log.info("worker-%d: stopped by signal SIGTERM (%s)", config.job.index, type(err).__name__)
        return EXIT_STOPPED


def arm_stop_watchdog() -> None:
    """Exits the process ``STOP_GRACE_S`` after a SIGTERM, whatever the main thread is doing.

    Python runs a signal's handler in the main thread only once that thread is back in the
    interpreter; one blocked inside native code (a TensorFlow op, a lock the handler would need)
    runs it late or never. The signal's number is also written, by the C-level handler, to the
    wakeup descriptor; a thread started beforehand reads it there and needs nothing from the
    main thread."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)

    def watch(kept_open: socket.socket) -> None:  # the writer lives as long as the watchdog
        while (signum := reader.recv(1)) != bytes([signal.SIGTERM]):
            if not signum:
                return
        time.sleep(STOP_GRACE_S)
        os._exit(EXIT_STOPPED)

    threading.Thread(target=watch, args=(writer,), name="stop-watchdog", daemon=True).start()


def arm_exit_watchdog(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Ends the process with ``code`` if the interpreter's exit has not ended it ``grace_s`` from now.

    The worker's work is done by now (its tasks reported, its model exported). The exit still
    joins every thread a pool started, and one of them inside a call that does not return (a
    neighbour's send being retried, a server's handler) would keep a finished worker alive, its
    pod Running. Every thread's stack goes to stderr first, to say which one it was."""

    def watch() -> None:
        time.sleep(grace_s)
        print(f"worker: the process had not exited {grace_s:.0f} s after the worker finished; "
              f"its threads (ending it with exit code {code}):", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=watch, name="exit-watchdog", daemon=True).start()


def _check_model_for_mode(config: WorkerConfig, trainer: BackendTrainer) -> None:
    """What the model and the job's mode cannot do together (``api/modes.py`` says which
    combinations), checked once per job: by worker 0, the one replica every job starts with and the
    first that builds the model (the PS and coordinator carry no framework). Its ModelError or
    OptimizerError ends it with exit code 2, which fails the job at once with its line
    (``exits.py``); the other workers do not repeat it."""
    from elasticps.api.optimizer import OptimizerError
    from elasticps.backends.api import ModelError

    mode = config.job.mode
    problem = mode.tables_problem(bool(trainer.tables()))
    if problem:
        raise ModelError(f"{config.model.model_def}: {problem}")
    problem = mode.optimizer_problem(trainer.optimizer_config(config.job.training.learning_rate).name)
    if problem:
        raise OptimizerError(problem)


def _run(config: WorkerConfig, stopping: threading.Event) -> int:
    # Imported here: `elasticps ps --help` and the runner must not pay for TensorFlow.
    from elasticps.coordinator.client import CoordinatorClient
    from elasticps.data.readers import DataError, ReaderOptions, open_reader
    from elasticps.psclient.client import ModelMismatch, PSClient
    from elasticps.api.optimizer import OptimizerError
    from elasticps.backends.api import Backend, ModelError, TrainerOptions, blame_model_code
    from elasticps.backends.registry import backend_for
    from elasticps.model_contract import Metadata
    from prometheus_client import REGISTRY, start_http_server

    from elasticps.storage import OutputError, check_output
    from elasticps.worker.metrics import WorkerMetrics
    from elasticps.worker.predicting import PredictionWriter
    from elasticps.worker.training import Prediction, Worker

    name = f"worker-{config.job.index}"
    backend: Backend | None = None
    module: Any = None
    try:
        backend = backend_for(config.model.framework)
        backend.configure_threads(config.num_threads or available_cpus())
        module = backend.load_model(config.model.model_def)
        data, options = config.job.data, ReaderOptions.of(config.job.data)
        training = open_reader(data.reader, data.training, options) if data.training else None
        validation = open_reader(data.reader, data.validation, options) if data.validation else None
        spec = config.job.prediction
        to_predict = open_reader(data.reader, spec.data, options) if spec.enabled else None
        # A reader of tabular data that knows its columns names them (ElasticDL's metadata).
        columns = getattr(training if training is not None else to_predict, "column_names", None)
        mode = config.job.mode
        # Embedding tables live on the PS in the modes that push gradients; a decentralized
        # worker keeps them local (its model is its own).
        trainer_options = TrainerOptions(
            config.job.training.minibatch_size,
            seed=config.job.index * 7919 + config.job.training.seed,
            model_seed=config.job.training.seed,
            learning_rate=config.job.training.learning_rate,
            metadata=Metadata(None if columns is None else tuple(columns), data.reader),
            serve_tables=config.strategy is Strategy.PARAMETER_SERVER,
        )
        trainer = backend.trainer(module, config.model.params, trainer_options)
        if config.job.index == 0:
            _check_model_for_mode(config, trainer)
        if spec.standalone:
            trainer.load_exported(spec.model)
        if config.job.output:
            check_output(config.job.output)  # a path under a file, an unknown scheme: not at the end
    except (ModelError, DataError, OptimizerError, OutputError) as err:
        return user_error(name, err)
    except Exception as err:
        blamed = None if backend is None or module is None else blame_model_code(err, backend.model_file(module))
        if blamed is None:
            raise
        return user_error(name, blamed)  # the model module's own code raised while building it
    metrics = WorkerMetrics(REGISTRY, name)
    pace = pace_for(config.job.training.slowdown, config.job.index)
    peer = _peer(config, trainer, metrics, pace) if config.strategy is Strategy.DECENTRALIZED else None
    ps = PSClient(config.ps_addrs, worker=name, split_bytes=config.job.training.split_bytes) if peer is None else None
    if ps is not None and trainer.tables():
        ps.declare_tables(trainer.tables())
        client = ps
        trainer.serve_rows(lambda ids, training=True: client.pull_embeddings(ids, read_only=not training).rows,
                           client.held_rows)
    coordinator = CoordinatorClient(config.coordinator_addr, worker=name,
                                    iteration_fn=None if peer is None else (lambda: peer.state.iteration))
    if config.metrics_port:
        start_http_server(config.metrics_port, registry=REGISTRY)
    health_server = _serve_health(config.health_port) if config.health_port else None
    prediction = (
        None
        if to_predict is None
        else Prediction(
            to_predict,
            PredictionWriter(config.job.output),
            standalone=spec.standalone,
            processor=lambda outputs: trainer.process_predictions(outputs, config.job.index),
        )
    )
    worker = Worker(
        config.job.training,
        mode,
        trainer,
        ps,
        coordinator,
        training,
        validation,
        metrics=metrics,
        exporter=_exporter(config),
        prediction=prediction,
        pace=pace,
        peer=None if peer is None else (peer.model, peer.step),
        stopping=stopping,
    )
    try:
        worker.run()
    except (ModelError, ModelMismatch) as err:  # a data function that breaks the contract, or PS shards
        # holding another model or one placed by another rule (an old checkpoint): restarting cannot help
        return user_error(name, err)
    except Exception as err:
        blamed = blame_model_code(err, backend.model_file(module))
        if blamed is None:
            raise  # not the model module's: a traceback, and the replica's restart policy
        return user_error(name, blamed)  # its own code raised (a data function, a loss ...): its line
    finally:
        if ps is not None:
            ps.close()
        coordinator.close()
        if peer is not None:
            peer.close()
        if health_server is not None:
            health_server.stop(grace=None)
    log.info("%s done: %s", name, worker.counters)
    total = cpu_seconds()
    since = None if worker.first_task_cpu_s is None else total - worker.first_task_cpu_s
    log.info("%s", cpu_line(name, total, since, worker.counters.examples))
    return 0


def _peer(config: WorkerConfig, trainer: Any, metrics: Any, pace: Any) -> Any:
    """A decentralized worker's Peer service, serving from now on, and its model and step."""
    from elasticps.worker.peer_wiring import start_peer

    return start_peer(config.job.index, config.peer_addrs, config.peer_port, config.decentralized, trainer, metrics, pace)


def _exporter(config: WorkerConfig) -> Exporter | None:
    """Where an export task's model goes, and the job.json it carries (None: the job has no output)."""
    if not config.job.output or config.job.prediction.standalone:
        return None
    name = config.job_name or "trainingjob"
    return Exporter(config.job.output, exported_job(name, config.model, config.job.data, config.job.training, config.job.output))


def _serve_health(port: int) -> grpc.Server:
    """The standard gRPC health service, SERVING from start-up to exit (pod probes ask it)."""
    server = create_server(max_workers=2)
    servicer = add_health(server)
    bind(server, "0.0.0.0", port)
    server.start()
    serving(servicer)
    return server
