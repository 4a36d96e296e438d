"""``python -m elasticps.tools.fake_workers``: many real workers as threads of one process, no TensorFlow.

Each thread is the real worker loop (``worker.training.Worker``: get a task, pull, compute, push,
join the round in sync, report, say goodbye) with the real ``PSClient`` and ``CoordinatorClient``;
only the model is :class:`~elasticps.tools.fake_trainer.NumpyTrainer`. The scale tests and the soak
start a few of these processes against real PS processes (``elasticps.tools.scale_job``).

What the process saw is written as JSON to ``--report`` when every worker is done, or when it is
stopped (SIGTERM: the calls in flight then are not counted; the soak stops its workers so):

* ``calls``: every attempt of every gRPC call, by method and status code (a gRPC interceptor on
  the clients, so the retries the clients make on transient failures are counted too);
* ``pushes``, ``pushes_accepted``, ``pushes_rejected`` and ``push_seconds`` (each push to every
  shard, as ``LocalModel`` makes it, timed around each push the client sends);
* ``steps``, ``pulls``, ``rejected`` (the workers' own counters) and ``errors`` (a worker whose
  loop raised: its type and message).

``--push_delay_s S`` holds every push of this process's workers S seconds before it is sent: the
time a large model's gradients spend on the wire, so a process of slow pushers runs beside fast ones.

``--progress FILE`` appends the calls so far as one JSON line every ``--progress_s`` seconds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import numpy as np
from prometheus_client import CollectorRegistry

from elasticps.api.flags import add_data_flags, add_training_flags, data_from_args, training_from_args
from elasticps.api.modes import TrainingMode
from elasticps.api.spec import DataSpec, TrainingSpec
from elasticps.coordinator.client import CoordinatorClient
from elasticps.data.readers import ReaderOptions, open_reader
from elasticps.files import write_atomically
from elasticps.psclient.client import PSClient, Pushed, PushRequest
from elasticps.tools.fake_trainer import NumpyTrainer
from elasticps.worker.metrics import WorkerMetrics
from elasticps.worker.training import Worker

log = logging.getLogger(__name__)


class CallCounter(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
):
    """Counts every call attempt's status code by method, once the call is over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._codes: Counter[tuple[str, str]] = Counter()

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            codes = dict(self._codes)
        out: dict[str, dict[str, int]] = {}
        for (method, code), count in sorted(codes.items()):
            out.setdefault(method, {})[code] = count
        return out

    def _watch(self, method: str, call: Any) -> Any:
        name = method.rsplit("/", 1)[-1]

        def done(finished: Any) -> None:
            code = finished.code()
            with self._lock:
                self._codes[(name, code.name if code is not None else "UNKNOWN")] += 1

        call.add_done_callback(done)
        return call

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return self._watch(details.method, continuation(details, request))

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return self._watch(details.method, continuation(details, request))

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]) -> Any:
        return self._watch(details.method, continuation(details, requests))


@dataclass
class PushLog:
    """Every push of the process: how long it took, whether every shard took it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seconds: list[float] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0

    def add(self, seconds: float, pushed: Pushed) -> None:
        with self.lock:
            self.seconds.append(seconds)
            if pushed.all_accepted:
                self.accepted += 1
            else:
                self.rejected += 1


class TimedPSClient(PSClient):
    """The real client, its pushes timed and counted into a :class:`PushLog`."""

    def __init__(self, pushes: PushLog, *args: Any, push_delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pushes = pushes
        self._push_delay_s = push_delay_s

    def _send(self, request: PushRequest) -> Pushed:
        started = time.monotonic()
        if self._push_delay_s > 0:
            time.sleep(self._push_delay_s)
        pushed = super()._send(request)
        self._pushes.add(time.monotonic() - started, pushed)
        return pushed


@dataclass(frozen=True)
class FleetConfig:
    ps_addrs: tuple[str, ...]
    workers: int
    name: str  # worker names are <name>-<i>
    training: TrainingSpec
    data: DataSpec
    report: Path
    progress: Path | None = None
    progress_s: float = 5.0
    timeout_s: float = 30.0  # each call's deadline (JoinRound: plus its wait)
    deadline_s: float = 60.0  # how long a client retries transient failures
    heartbeat_s: float = 5.0
    push_delay_s: float = 0.0  # every push waits this long before it is sent (a slow, large push)


class Fleet:
    """The workers of one process, their clients and what they counted."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.calls = CallCounter()
        self.pushes = PushLog()
        self.errors: list[str] = []
        self.workers: list[Worker] = []
        self.started = time.monotonic()
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        config = self.config
        mode = TrainingMode.of(config.training)
        reader = open_reader(config.data.reader, config.data.training, ReaderOptions.of(config.data))
        threads = []
        for i in range(config.workers):
            name = f"{config.name}-{i}"
            ps = TimedPSClient(self.pushes, config.ps_addrs, worker=name, deadline_s=config.deadline_s,
                               timeout_s=config.timeout_s, interceptors=[self.calls],
                               push_delay_s=config.push_delay_s)  # fmt: skip
            coordinator = CoordinatorClient(config.ps_addrs[0], worker=name, deadline_s=config.deadline_s,
                                            timeout_s=config.timeout_s, interceptors=[self.calls])  # fmt: skip
            self._closers += [ps.close, coordinator.close]
            trainer = NumpyTrainer(len(config.ps_addrs), config.training.minibatch_size)
            worker = Worker(config.training, mode, trainer, ps, coordinator, reader, None,
                            heartbeat_s=config.heartbeat_s, metrics=WorkerMetrics(CollectorRegistry(), name))  # fmt: skip
            self.workers.append(worker)
            threads.append(threading.Thread(target=self._run_one, args=(name, worker), name=name, daemon=True))
        progress = threading.Thread(target=self._progress, name="progress", daemon=True)
        progress.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # in short waits: a SIGTERM that another thread took runs its handler here
                thread.join(0.5)
        for close in self._closers:
            close()

    def _run_one(self, name: str, worker: Worker) -> None:
        try:
            worker.run()
        except Exception as err:  # counted and reported: the harness asserts there are none
            log.error("%s failed: %s: %s", name, type(err).__name__, err)
            with self._lock:
                self.errors.append(f"{name}: {type(err).__name__}: {err}")

    def _progress(self) -> None:
        path = self.config.progress
        if path is None:
            return
        while True:
            time.sleep(self.config.progress_s)
            line = {"t": time.time(), "calls": self.calls.snapshot(), "pushes": len(self.pushes.seconds)}
            with path.open("a") as out:
                out.write(json.dumps(line) + "\n")

    def report(self) -> dict[str, Any]:
        with self.pushes.lock:
            seconds = list(self.pushes.seconds)
            accepted, rejected = self.pushes.accepted, self.pushes.rejected
        with self._lock:
            errors = list(self.errors)
        return {
            "t": time.time(),
            "name": self.config.name,
            "workers": self.config.workers,
            "elapsed_s": time.monotonic() - self.started,
            "steps": sum(w.counters.steps for w in self.workers),
            "pulls": sum(w.counters.pulls for w in self.workers),
            "rejected": sum(w.counters.rejected for w in self.workers),
            "pushes": len(seconds),
            "pushes_accepted": accepted,
            "pushes_rejected": rejected,
            "push_seconds": seconds,
            "calls": self.calls.snapshot(),
            "errors": errors,
        }

    def write_report(self) -> None:
        write_atomically(self.config.report, json.dumps(self.report()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ps_addrs", required=True, help="every PS's host:port, shard order (PS 0 coordinates)")
    parser.add_argument("--workers", type=int, required=True, help="worker threads in this process")
    parser.add_argument("--name", default="fake", help="worker names are <name>-<i>")
    parser.add_argument("--report", required=True, help="write what the workers saw here, as JSON")
    parser.add_argument("--progress", default="", help="append the calls so far here every --progress_s (JSON lines)")
    parser.add_argument("--progress_s", type=float, default=5.0)
    parser.add_argument("--timeout_s", type=float, default=30.0, help="each call's deadline")
    parser.add_argument("--deadline_s", type=float, default=60.0, help="how long transient failures are retried")
    parser.add_argument("--push_delay_s", type=float, default=0.0, help="hold every push this long before sending it")
    add_data_flags(parser)
    add_training_flags(parser)


def config_from_args(args: argparse.Namespace) -> FleetConfig:
    if args.workers < 1:
        raise SystemExit(f"error: --workers must be >= 1, got {args.workers}")
    return FleetConfig(
        ps_addrs=tuple(a for a in args.ps_addrs.split(",") if a),
        workers=args.workers,
        name=args.name,
        training=training_from_args(args),
        data=data_from_args(args),
        report=Path(args.report),
        progress=Path(args.progress) if args.progress else None,
        progress_s=args.progress_s,
        timeout_s=args.timeout_s,
        deadline_s=args.deadline_s,
        push_delay_s=args.push_delay_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elasticps.tools.fake_workers", description=__doc__.split("\n")[0])
    add_arguments(parser)
    config = config_from_args(parser.parse_args(argv))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(levelname)s %(message)s")
    fleet = Fleet(config)

    def stop(signum: int, frame: FrameType | None) -> None:
        fleet.write_report()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    fleet.run()
    fleet.write_report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
