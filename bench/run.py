"""``make bench``: PS push + pull round trips against raw TCP on loopback, measured in one run.

Per model size (1, 16, 64 MB of float32 parameters), interleaved repetition by repetition so machine
noise hits every case alike:

* ``tcp``: a raw-TCP echo of N bytes between this process and a server process (``bench.tcp_echo``);
* ``tcp_apply``: the ceiling of the PS: raw TCP moving the same bytes each way (push N bytes, the model
  of N bytes back as the pull) with the server applying the PS's SGD to its float32 variables in place,
  views of the received buffer (``bench.tcp_apply``);
* ``grpc_raw``: the same call shapes as the PS over gRPC carrying raw byte chunks, without protobuf,
  frames or a store (``bench.grpc_raw``): the floor of grpcio's Python message path;
* ``ps_bulk``: a push of an N-byte model with a pull right behind it (``PushRequest.pull_behind``,
  as an async worker steps: both in one write, the pull answered once the push is applied) against a
  real ``elasticps ps --use_async`` process, through :class:`elasticps.psclient.client.PSClient`, over the
  PS's bulk channel (raw TCP, ``elasticps/rpc/bulk.py``);
* ``ps@<chunk>``: the same over gRPC frames (``PSClient(use_bulk=False)``), at the default chunk size
  and, at 16 and 64 MB, at other chunk sizes (client pushes and server pulls alike).

Every round trip moves N bytes each way: MB/s = 2 * N / seconds, MB = 2**20 bytes. Writes
``bench/results/datapath.json`` (every sample), ``docs/benchmarks.md`` and ``docs/img/datapath.png``.
All processes run with the glibc malloc settings the local runner gives its children (this one
re-executes itself with them if they are missing).
"""

from __future__ import annotations

import os
import sys

from elasticps.local.processes import CHILD_ENV


def _reexec_with_child_env() -> None:
    """Re-executes this module with CHILD_ENV (malloc thresholds) unless it is already set."""
    if all(os.environ.get(key) == value for key, value in CHILD_ENV.items()):
        return
    env = {**os.environ, **CHILD_ENV}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "bench.run", *sys.argv[1:]], env)


if __name__ == "__main__":
    _reexec_with_child_env()

# The heavy imports come after the re-exec so they happen once, under the right allocator settings.
import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from bench import report, stages  # noqa: E402
from bench.grpc_raw import RawClient  # noqa: E402
from bench.tcp_apply import ApplyClient  # noqa: E402
from bench.tcp_echo import EchoClient  # noqa: E402
from elasticps import identity  # noqa: E402
from elasticps.psclient.client import PSClient, PullBehind, PushRequest  # noqa: E402
from elasticps.api.optimizer import OptimizerConfig  # noqa: E402
from elasticps.rpc.frames import CHUNK_BYTES  # noqa: E402

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "datapath.json"
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "img" / "datapath.png"

SIZES_MB = (1, 16, 64)
CHUNK_VARIANTS = (256 << 10, 1 << 20, 4 << 20)  # the PS chunk sizes compared at CHUNK_SIZES_MB
CHUNK_SIZES_MB = (16, 64)
NUM_VARIABLES = 4  # the model: this many float32 variables of equal size
LEARNING_RATE = 0.01
GRADIENT = 1e-3  # every gradient element; each push moves every parameter by -LEARNING_RATE * GRADIENT
BULK = "ps_bulk"  # the PS case over its bulk channel (the others, ps@<chunk>, over gRPC frames)


@dataclass(frozen=True)
class Plan:
    """Repetitions of one size: warm-ups, then at least ``min_reps`` and at most ``max_reps``, or
    fewer than ``max_reps`` once ``budget_s`` is spent."""

    warmup: int
    min_reps: int
    max_reps: int
    budget_s: float


PLANS = {1: Plan(5, 15, 60, 6.0), 16: Plan(2, 9, 25, 15.0), 64: Plan(2, 7, 15, 30.0)}
QUICK_PLANS = {1: Plan(2, 5, 5, 2.0), 16: Plan(1, 3, 3, 4.0), 64: Plan(1, 3, 3, 8.0)}


# ---- processes ------------------------------------------------------------------------------------
@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port_file: Path

    def wait_port(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{_tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start in {timeout_s:.0f} s:\n{_tail(self.log)}")
            time.sleep(0.02)
        return int(self.port_file.read_text())

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(name: str, args: list[str], port_file: Path, env: dict[str, str] | None = None) -> Child:
    log = port_file.with_suffix(".log")
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CHILD_ENV, **(env or {})},
        )
    return Child(name, popen, log, port_file)


def start_tcp_server(workdir: Path) -> Child:
    port_file = workdir / "tcp-echo.port"
    return _spawn("tcp-echo", ["-m", "bench.tcp_echo", str(port_file)], port_file)


def start_tcp_apply(workdir: Path) -> Child:
    port_file = workdir / "tcp-apply.port"
    return _spawn("tcp-apply", ["-m", "bench.tcp_apply", str(port_file)], port_file)


def start_grpc_raw(workdir: Path) -> Child:
    port_file = workdir / "grpc-raw.port"
    return _spawn("grpc-raw", ["-m", "bench.grpc_raw", str(port_file)], port_file)


def start_ps(name: str, workdir: Path, data: Path, chunk_bytes: int, key: bytes | None = None) -> Child:
    """``key``: the job's (``identity.py``): the PS then serves only callers with its tokens. It
    reads the key from a file, as a pod does from its mounted Secret (re-read when it changes)."""
    port_file = workdir / f"{name}.port"
    env: dict[str, str] = {}
    if key is not None:
        key_file = workdir / f"{name}.keys"
        key_file.write_text(identity.format_keys((key,)))
        env[identity.KEY_FILE_ENV] = str(key_file)
    args = [
        "-m", "elasticps", "--log_level", "WARNING", "ps",
        "--ps_id", "0", "--num_ps", "1", "--host", "127.0.0.1", "--port", "0",
        "--port_file", str(port_file), "--use_async",
        "--data_reader", "npz", "--training_data", str(data),
        "--chunk_bytes", str(chunk_bytes),
    ]  # fmt: skip
    return _spawn(name, args, port_file, env)


# ---- measured cases -----------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Case:
    """One thing timed per repetition: ``run`` performs one round trip of ``size_mb`` each way.

    Also sums the CPU time this process and the server process ``server_pid`` spend in the round trips.
    """

    name: str
    run: Callable[[], None]
    server_pid: int
    samples_s: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    def timed(self) -> float:
        server0, client0 = _cpu_s(self.server_pid), time.process_time()
        t0 = time.perf_counter()
        self.run()
        elapsed = time.perf_counter() - t0
        self.client_cpu_s += time.process_time() - client0
        self.server_cpu_s += _cpu_s(self.server_pid) - server0
        self.samples_s.append(elapsed)
        return elapsed


class PSCase:
    """A PSClient against one PS process holding a ``size_mb`` model; one round trip = push + full pull."""

    def __init__(self, port: int, size_mb: int, chunk_bytes: int, use_bulk: bool, token: str = "") -> None:
        """``token``: the client's in the job (with a PS started with its key), "" for none."""
        self.client = PSClient(
            [f"127.0.0.1:{port}"], worker="worker-0" if token else "bench", chunk_bytes=chunk_bytes, deadline_s=60.0,
            use_bulk=use_bulk, token=token,
        )
        elements = size_mb * MB // 4 // NUM_VARIABLES
        model = {f"layer{i}/kernel": np.full(elements, 0.5, dtype=np.float32) for i in range(NUM_VARIABLES)}
        self.gradients = {name: np.full_like(value, GRADIENT) for name, value in model.items()}
        self.versions = self.client.push_model(model, OptimizerConfig("sgd", {"learning_rate": LEARNING_RATE}))
        self.pushes = 0
        self.last: dict[str, np.ndarray] = {}

    def round_trip(self) -> None:
        # As an async worker steps: the pull goes right behind the push (its model includes the push).
        pushed = self.client.push(PushRequest(self.gradients, self.versions, pull_behind=PullBehind(0))).result()
        if pushed.behind is None:
            raise RuntimeError("the push sent no pull behind it")
        pulled = pushed.behind.result()
        if not pushed.all_accepted or len(pulled.tensors) != NUM_VARIABLES:
            raise RuntimeError(f"push accepted {pushed.accepted}, pull returned {sorted(pulled.tensors)}")
        self.versions = pulled.versions
        self.pushes += 1
        self.last = pulled.tensors

    def check(self) -> float:
        """The largest deviation of the pulled model from 0.5 - pushes * lr * gradient (float32 steps)."""
        expected = np.float32(0.5)
        step = np.float32(LEARNING_RATE) * np.float32(GRADIENT)
        for _ in range(self.pushes):
            expected = np.float32(expected - step)
        worst = max(float(np.max(np.abs(value - expected))) for value in self.last.values())
        if worst > 1e-6:
            raise RuntimeError(f"the pulled model is off by {worst}: pushes were not applied as expected")
        return worst

    def close(self) -> None:
        self.client.close()


def _label(name: str) -> str:
    if not name.startswith("ps@"):
        return name
    chunk_bytes = int(name[3:])
    size = f"{chunk_bytes >> 20}M" if chunk_bytes >= MB else f"{chunk_bytes >> 10}K"
    return "ps_frames" if chunk_bytes == CHUNK_BYTES else f"ps_frames/{size}"


@dataclass
class Baselines:
    """The reference servers, started once for every size: raw TCP echo, the TCP + SGD ceiling, gRPC raw."""

    echo: EchoClient
    echo_pid: int
    ceiling: ApplyClient
    ceiling_pid: int
    raw: RawClient
    raw_pid: int


def _check_ceiling(ceiling: ApplyClient, round_trips: int) -> None:
    """The ceiling's pulled model, like the PS's: 0.5 - round_trips * lr * gradient (float32 steps)."""
    expected = np.float32(0.5)
    step = np.float32(LEARNING_RATE) * np.float32(GRADIENT)
    for _ in range(round_trips):
        expected = np.float32(expected - step)
    worst = float(np.max(np.abs(ceiling.model - expected)))
    if worst > 1e-6:
        raise RuntimeError(f"the TCP ceiling's model is off by {worst}: its updates were not applied")


def measure_size(size_mb: int, plan: Plan, base: Baselines, workdir: Path, data: Path) -> dict[str, Any]:
    chunks = CHUNK_VARIANTS if size_mb in CHUNK_SIZES_MB else (CHUNK_BYTES,)
    if CHUNK_BYTES not in chunks:
        chunks = (CHUNK_BYTES, *chunks)
    servers: dict[int | str, Child] = {c: start_ps(f"ps-{size_mb}mb-{c}", workdir, data, c) for c in chunks}
    servers[BULK] = start_ps(f"ps-{size_mb}mb-bulk", workdir, data, CHUNK_BYTES)
    ps_cases: dict[int | str, PSCase] = {}
    try:
        for key, server in servers.items():
            ps_cases[key] = PSCase(server.wait_port(), size_mb, CHUNK_BYTES if key == BULK else int(key), key == BULK)
        base.echo.prepare(size_mb * MB)
        base.ceiling.prepare(size_mb * MB, NUM_VARIABLES, GRADIENT)
        base.raw.prepare(size_mb * MB)
        cases = [
            Case("tcp", base.echo.round_trip, base.echo_pid),
            Case("tcp_apply", base.ceiling.round_trip, base.ceiling_pid),
            Case("grpc_raw", base.raw.round_trip, base.raw_pid),
        ]
        cases.append(Case(BULK, ps_cases[BULK].round_trip, servers[BULK].popen.pid))
        cases += [Case(f"ps@{chunk}", ps_cases[chunk].round_trip, servers[chunk].popen.pid) for chunk in chunks]
        print(f"[{size_mb} MB] warm-up ({plan.warmup} round trips per case)", flush=True)
        for _ in range(plan.warmup):
            for case in cases:
                case.run()
        started = time.monotonic()
        rep = 0
        while rep < plan.max_reps and (rep < plan.min_reps or time.monotonic() - started < plan.budget_s):
            # Rotate the order each repetition: no case always runs right after the same other one.
            order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
            for case in order:
                case.timed()
            rep += 1
            line = ", ".join(f"{_label(c.name)} {_mbps(size_mb, c.samples_s[-1]):.0f}" for c in cases)
            print(f"[{size_mb} MB] rep {rep}: MB/s {line}", flush=True)
        deviation = max(ps_case.check() for ps_case in ps_cases.values())
        _check_ceiling(base.ceiling, plan.warmup + rep)
    finally:
        for ps_case in ps_cases.values():
            ps_case.close()
        for server in servers.values():
            server.stop()
    return {
        "size_mb": size_mb,
        "bytes": size_mb * MB,
        "repetitions": rep,
        "warmup": plan.warmup,
        "model_check_max_abs_error": deviation,
        "cases": {case.name: _summary(size_mb, case, cases[0], cases[1]) for case in cases},
    }


def _mbps(size_mb: int, seconds: float) -> float:
    return 2 * size_mb / seconds


def _summary(size_mb: int, case: Case, tcp: Case, ceiling: Case) -> dict[str, Any]:
    samples = case.samples_s
    rates = [_mbps(size_mb, s) for s in samples]
    # The same repetition's TCP round trip ran next to this one: its ratio sees the same noise.
    paired = [t / s for s, t in zip(samples, tcp.samples_s)]
    paired_ceiling = [t / s for s, t in zip(samples, ceiling.samples_s)]
    return {
        "samples_s": samples,
        "median_s": float(np.median(samples)),
        "mbps_median": _mbps(size_mb, float(np.median(samples))),
        "mbps_min": min(rates),
        "mbps_max": max(rates),
        "paired_ratio_median": float(np.median(paired)),
        "paired_ratio_min": min(paired),
        "paired_ratio_max": max(paired),
        "paired_ceiling_ratio_median": float(np.median(paired_ceiling)),
        "paired_ceiling_ratio_min": min(paired_ceiling),
        "paired_ceiling_ratio_max": max(paired_ceiling),
        "client_cpu_ms_per_round_trip": 1e3 * case.client_cpu_s / len(samples),
        "server_cpu_ms_per_round_trip": 1e3 * case.server_cpu_s / len(samples),
    }


# ---- the run --------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    import google.protobuf
    import grpc
    from google.protobuf.internal import api_implementation

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "protobuf": f"{google.protobuf.__version__} ({api_implementation.Type()})",
        "numpy": np.__version__,
        # As this process really runs (it re-executed itself with CHILD_ENV); the servers get the same.
        "malloc_env": {k: os.environ.get(k, "(unset)") for k in CHILD_ENV if k.startswith("MALLOC_")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="model sizes in MB (default 1,16,64)")
    parser.add_argument("--quick", action="store_true", help="few repetitions (a smoke test, not a result)")
    parser.add_argument("--no_write", action="store_true", help="print only: leave docs/ and bench/results/ alone")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    plans = QUICK_PLANS if args.quick else PLANS
    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="elasticps-bench-"))
    data = workdir / "tiny.npz"
    np.savez(data, x=np.zeros((10, 4), dtype=np.float32), y=np.zeros(10, dtype=np.int64))
    results: list[dict[str, Any]] = []
    tcp = start_tcp_server(workdir)
    tcp_apply = start_tcp_apply(workdir)
    grpc_raw = start_grpc_raw(workdir)
    clients: list[EchoClient | ApplyClient | RawClient] = []
    try:
        echo = EchoClient(tcp.wait_port())
        clients.append(echo)
        ceiling = ApplyClient(tcp_apply.wait_port())
        clients.append(ceiling)
        raw = RawClient(grpc_raw.wait_port())
        clients.append(raw)
        base = Baselines(echo, tcp.popen.pid, ceiling, tcp_apply.popen.pid, raw, grpc_raw.popen.pid)
        for size_mb in sizes:
            plan = plans.get(size_mb) or plans[min(plans, key=lambda k: abs(k - size_mb))]
            results.append(measure_size(size_mb, plan, base, workdir, data))
            summary = results[-1]["cases"]
            ps_mbps = summary[BULK]["mbps_median"]
            print(f"[{size_mb} MB] median MB/s: tcp {summary['tcp']['mbps_median']:.0f}, "
                  f"ceiling {summary['tcp_apply']['mbps_median']:.0f}, ps {ps_mbps:.0f}, "
                  f"ps frames {summary[f'ps@{CHUNK_BYTES}']['mbps_median']:.0f}, "
                  f"PS/ceiling {ps_mbps / summary['tcp_apply']['mbps_median']:.2f}, "
                  f"PS/TCP {ps_mbps / summary['tcp']['mbps_median']:.2f}", flush=True)  # fmt: skip
    finally:
        for client in clients:
            client.close()
        tcp.stop()
        tcp_apply.stop()
        grpc_raw.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("stage timings (in-process, CPU of the Python steps) ...", flush=True)
    stage_times = stages.measure([s for s in sizes if s >= 16] or sizes, CHUNK_BYTES)
    document = {
        "benchmark": "datapath",
        "date": date,
        "quick": args.quick,
        "machine": machine_info(),
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "config": {
            "mb": MB,
            "mbps": "2 * bytes / seconds / 2**20 (a round trip moves the model each way)",
            "default_chunk_bytes": CHUNK_BYTES,
            "chunk_variants": list(CHUNK_VARIANTS),
            "chunk_sizes_mb": list(CHUNK_SIZES_MB),
            "num_variables": NUM_VARIABLES,
            "ps_mode": "async (--use_async), sgd lr 0.01",
            "plans": {str(k): vars(v) for k, v in plans.items()},
        },
        "sizes": results,
        "stages": stage_times,
        "runtime_s": round(time.monotonic() - started, 1),
    }
    for line in report.summary_lines(document):
        print(line)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(document, indent=1) + "\n")
        report.plot(document, PLOT)
        report.write_markdown(document, DOC, PLOT.relative_to(DOC.parent).as_posix(), RESULTS.relative_to(ROOT).as_posix())
        print(f"wrote {RESULTS.relative_to(ROOT)}, {DOC.relative_to(ROOT)}, {PLOT.relative_to(ROOT)}")
    print(f"bench took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
