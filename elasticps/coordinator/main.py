"""``elasticps coordinator``: the coordinator of a decentralized job, alone (no parameter store).

Under the PS strategy PS 0 hosts the coordinator. A decentralized job has no PS, so its coordinator
runs as a small process of its own (a pod behind a Service on a cluster): it cuts the data into
tasks, hands them out, counts what the workers report, schedules evaluations and the final export,
and reads the workers' iterations from their heartbeats (``iterations.py``), which stand in for the
model version. The same gRPC service as PS 0's, so workers, the local runner and the operator talk
to it as they do to PS 0. SIGTERM stops it (2 s grace for calls in flight).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from elasticps import identity
from elasticps.api.context import RoleContext, add_job_flags, context_from_args
from elasticps.api.replicas import Role
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.iterations import Iterations
from elasticps.coordinator.servicer import CoordinatorServicer, add_to_server
from elasticps.coordinator.settings import queue_settings
from elasticps.data.readers import DataError
from elasticps.exits import user_error
from elasticps.files import write_atomically
from elasticps.rpc.channels import bind
from elasticps.rpc.health import add_async_health
from elasticps.rpc.serving import WORK_THREADS, AsyncServer
from elasticps.storage import OutputError, check_output

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class CoordinatorConfig:
    host: str
    port: int
    port_file: str
    job: RoleContext


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=2222, help="port to listen on (0: any free port)")
    parser.add_argument("--port_file", default="", help="write the bound port to this file once serving")
    add_job_flags(parser, "the job's output (spec.output): where the final model goes")


def config_from_args(args: argparse.Namespace) -> CoordinatorConfig:
    return CoordinatorConfig(
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        job=context_from_args(args, Role.COORDINATOR),
    )


def run(config: CoordinatorConfig) -> int:
    try:
        job = config.job
        settings = queue_settings(job.data, job.training, job.prediction, job.output)
        if job.output:
            check_output(job.output)
        verifier = identity.key_from_env()
    except (DataError, OutputError, identity.IdentityError) as err:
        return user_error("coordinator", err)
    iterations = Iterations()
    t = job.training
    journal = Path(t.checkpoint_dir) / "coordinator.json" if t.checkpoint_dir else None
    coordinator = Coordinator(settings, version_fn=lambda: iterations.newest, journal=journal,
                              output=job.output, iterations=iterations)
    server = AsyncServer(WORK_THREADS, verifier)
    add_to_server(CoordinatorServicer(coordinator), server)
    coordinator.start()
    health = add_async_health(server)
    port = bind(server, config.host, config.port)
    server.start()
    health.serving()
    if config.port_file:
        write_atomically(Path(config.port_file), f"{port}\n")
    log.info("coordinator serving on %s:%d", config.host, port)
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
    coordinator.stop()
    health.enter_graceful_shutdown()
    server.stop(grace=2).wait()
    return 0
