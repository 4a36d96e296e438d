"""A job of many fake workers against real PS processes on this machine: the scale tests' and the soak's.

:class:`ScaleJob` writes the job's records (``fake_trainer.records``, an npz file), starts the PS
shards as ``elasticps ps`` processes (PS 1.. first, on free ports; then PS 0 with their addresses,
as the local runner does), then ``--processes`` processes of ``elasticps.tools.fake_workers``, each
with its share of the workers, every process with the same training flags
(``api.flags.training_args`` of one :class:`TrainingSpec`). :meth:`ScaleJob.wait` waits for the
worker processes and reads their reports; past its timeout it stops them (SIGTERM: each writes what
it counted so far) and raises :class:`NotFinished` with that, so a stalled job fails with figures
instead of hanging. :func:`summarize` adds the reports up.

Every process's output goes to ``<directory>/<name>.log``; with ``round_log`` the PS shards write
every sync round's minibatches to ``<directory>/rounds/ps-<i>.jsonl`` (``ELASTICPS_ROUND_LOG``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from elasticps.api.flags import data_args, training_args
from elasticps.api.spec import DataReader, DataSpec, TrainingSpec
from elasticps.coordinator.client import CoordinatorClient
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient
from elasticps.ps.main import ROUND_LOG_ENV
from elasticps.tools.fake_trainer import records

START_S = 60.0  # a PS process has this long to report its port


class NotFinished(Exception):
    """The workers did not finish in time; ``reports`` holds what they counted until stopped."""

    def __init__(self, message: str, reports: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.reports = reports


@dataclass
class Summary:
    """Every worker process's report added up."""

    workers: int = 0
    steps: int = 0
    pushes: int = 0
    pushes_accepted: int = 0
    pushes_rejected: int = 0
    rejected: int = 0
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    push_p50_s: float = 0.0
    push_p99_s: float = 0.0
    push_max_s: float = 0.0

    def codes(self, code: str) -> int:
        """Call attempts that ended with ``code`` (a ``grpc.StatusCode`` name), every method."""
        return sum(by_code.get(code, 0) for by_code in self.calls.values())

    def methods_with(self, code: str) -> dict[str, int]:
        """The methods whose attempts ended with ``code``, and how many."""
        return {method: by_code[code] for method, by_code in self.calls.items() if by_code.get(code)}

    def failed_calls(self) -> int:
        """Call attempts that did not end OK."""
        return sum(n for by_code in self.calls.values() for code, n in by_code.items() if code != "OK")

    def total_calls(self) -> int:
        return sum(n for by_code in self.calls.values() for n in by_code.values())

    def line(self) -> str:
        return (
            f"{self.workers} workers: {self.steps} steps, {self.pushes} pushes ({self.pushes_accepted} accepted, "
            f"{self.pushes_rejected} rejected), {self.total_calls()} calls ({self.failed_calls()} not OK, "
            f"{self.codes('DEADLINE_EXCEEDED')} DEADLINE_EXCEEDED), push p50 {self.push_p50_s * 1000:.1f} ms, "
            f"p99 {self.push_p99_s * 1000:.1f} ms, max {self.push_max_s * 1000:.1f} ms, {len(self.errors)} errors"
        )


def summarize(reports: Sequence[dict[str, Any]]) -> Summary:
    summary = Summary()
    calls: Counter[tuple[str, str]] = Counter()
    seconds: list[float] = []
    for report in reports:
        summary.workers += int(report["workers"])
        summary.steps += int(report["steps"])
        summary.pushes += int(report["pushes"])
        summary.pushes_accepted += int(report["pushes_accepted"])
        summary.pushes_rejected += int(report["pushes_rejected"])
        summary.rejected += int(report["rejected"])
        summary.errors += list(report["errors"])
        seconds += report["push_seconds"]
        for method, by_code in report["calls"].items():
            for code, n in by_code.items():
                calls[(method, code)] += int(n)
    for (method, code), n in sorted(calls.items()):
        summary.calls.setdefault(method, {})[code] = n
    if seconds:
        summary.push_p50_s, summary.push_p99_s = (float(q) for q in np.quantile(seconds, [0.5, 0.99]))
        summary.push_max_s = max(seconds)
    return summary


class ScaleJob:
    """The PS processes and the fake worker processes of one job (a context manager: stops them all)."""

    def __init__(
        self,
        directory: Path,
        training: TrainingSpec,
        num_records: int,
        num_ps: int = 2,
        round_log: bool = False,
    ) -> None:
        self.directory = directory
        self.training = training
        self.num_ps = num_ps
        directory.mkdir(parents=True, exist_ok=True)
        x, y = records(num_records)
        train = directory / "train.npz"
        np.savez(train, x=x, y=y)
        self.data = DataSpec(training=str(train), reader=DataReader.NPZ.value)
        self.rounds = directory / "rounds" if round_log else None
        self.ps: list[subprocess.Popen[bytes]] = []
        self.addresses: list[str] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self._reports: list[Path] = []
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> ScaleJob:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # ---- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.directory / f"{name}.log").open("wb")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def start_ps(self, rpc_threads: int | None = None) -> list[str]:
        """Starts every shard and waits for their ports; returns their addresses, shard order."""
        env = dict(os.environ)
        if self.rounds is not None:
            env[ROUND_LOG_ENV] = str(self.rounds)
        flags = training_args(self.training) + data_args(self.data)
        if rpc_threads is not None:
            flags.append(f"--rpc_threads={rpc_threads}")
        ports: dict[int, int] = {}
        started: dict[int, subprocess.Popen[bytes]] = {}
        for shard in [*range(1, self.num_ps), 0]:  # PS 0 needs the others' addresses
            port_file = self.directory / f"ps-{shard}.port"
            argv = [sys.executable, "-m", "elasticps", "ps", f"--ps_id={shard}", f"--num_ps={self.num_ps}",
                    "--host=127.0.0.1", "--port=0", f"--port_file={port_file}", *flags]  # fmt: skip
            if shard == 0 and self.num_ps > 1:  # its own entry is a placeholder it never dials
                argv.append("--ps_addrs=" + ",".join(["127.0.0.1:0"] + [f"127.0.0.1:{ports[i]}" for i in range(1, self.num_ps)]))
            started[shard] = self._spawn(f"ps-{shard}", argv, env)
            self.ps.append(started[shard])  # stopped with the others even if a later one fails
            ports[shard] = self._port(started[shard], port_file, f"ps-{shard}")
        self.ps = [started[i] for i in range(self.num_ps)]
        self.addresses = [f"127.0.0.1:{ports[i]}" for i in range(self.num_ps)]
        return self.addresses

    def _port(self, process: subprocess.Popen[bytes], port_file: Path, name: str) -> int:
        give_up_at = time.monotonic() + START_S
        while not port_file.exists():
            if process.poll() is not None or time.monotonic() > give_up_at:
                raise RuntimeError(f"{name} did not start: {self.log(name)[-2000:]}")
            time.sleep(0.05)
        return int(port_file.read_text())

    def start_workers(
        self, processes: int, per_process: int, timeout_s: float = 30.0, deadline_s: float = 60.0,
        progress_s: float = 0.0, push_delay_s: float = 0.0, first: int = 0,
    ) -> None:  # fmt: skip
        """``processes`` processes of ``per_process`` fake workers each (``progress_s``: each
        appends its calls so far to ``<directory>/w<i>.progress`` that often; ``push_delay_s``:
        every push of theirs waits that long; ``first``: the first process's number, ``w<first>``)."""
        flags = training_args(self.training) + data_args(self.data)
        for i in range(first, first + processes):
            report = self.directory / f"w{i}.json"
            report.unlink(missing_ok=True)
            argv = [sys.executable, "-m", "elasticps.tools.fake_workers", f"--ps_addrs={','.join(self.addresses)}",
                    f"--workers={per_process}", f"--name=w{i}", f"--report={report}", f"--timeout_s={timeout_s}",
                    f"--deadline_s={deadline_s}", *flags]  # fmt: skip
            if push_delay_s > 0:
                argv.append(f"--push_delay_s={push_delay_s}")
            if progress_s > 0:
                argv += [f"--progress={self.directory / f'w{i}.progress'}", f"--progress_s={progress_s}"]
            self.workers.append(self._spawn(f"w{i}", argv))
            self._reports.append(report)

    def wait(self, timeout_s: float) -> list[dict[str, Any]]:
        """Waits for every worker process to finish; their reports. Past ``timeout_s``: stops them
        and raises :class:`NotFinished`; a process that fails raises RuntimeError with its log."""
        give_up_at = time.monotonic() + timeout_s
        while any(p.poll() is None for p in self.workers):
            if time.monotonic() > give_up_at:
                reports = self.stop_workers()
                raise NotFinished(f"the workers did not finish in {timeout_s:.0f} s", reports)
            time.sleep(0.2)
        for i, process in enumerate(self.workers):
            if process.returncode != 0:
                raise RuntimeError(f"w{i} exited {process.returncode}: {self.log(f'w{i}')[-3000:]}")
        return self.reports()

    def stop_workers(self) -> list[dict[str, Any]]:
        """SIGTERM to every worker process (each writes its report first); their reports."""
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return self.reports()

    def reports(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in self._reports if path.exists()]

    def stop(self) -> None:
        """Stops every process still running (workers first), then closes the logs."""
        for process in [*self.workers, *self.ps]:
            if process.poll() is None:
                process.terminate()
        for process in [*self.workers, *self.ps]:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs:
            log.close()
        self._logs = []

    # ---- what the PS side says ---------------------------------------------------------------
    def status(self) -> pb.JobStatus:
        client = CoordinatorClient(self.addresses[0], worker="scale-job-observer", deadline_s=30.0)
        try:
            return client.status(timeout_s=30.0)
        finally:
            client.close()

    def model(self) -> dict[str, np.ndarray]:
        """Every variable as the shards hold it now (one pull from each)."""
        client = PSClient(self.addresses, worker="scale-job-observer", deadline_s=30.0, timeout_s=30.0)
        try:
            return client.pull([-1] * self.num_ps).tensors
        finally:
            client.close()

    def round_log(self, shard: int) -> list[dict[str, Any]]:
        """Shard ``shard``'s sync rounds, in order (``round_log`` must be on)."""
        if self.rounds is None:
            raise ValueError("the job was started without round_log")
        path = self.rounds / f"ps-{shard}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""
