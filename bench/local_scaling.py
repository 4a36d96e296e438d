"""``python -m bench.local_scaling``: PS updates per second of a local MNIST job whose workers are scaled
while it trains (``elasticps scale``), against jobs that keep one worker count from the start.

Scenarios, interleaved repetition by repetition so machine noise hits every one alike:

* ``scaled``: started at 2 workers, scaled to 4, then to 1, while it trains;
* ``fixed 4`` and ``fixed 1``: started at 4 (at 1) workers and left alone.

Each run is a real ``elasticps run`` (its own run directory) of mnist_cnn on MNIST read by path
(``--data``, default ../shared/data/mnist; nothing is copied), with enough epochs that it never ends
on its own: it is stopped (SIGTERM) once its last phase is measured. A phase is one worker count:
after the request, the phase *settles* once exactly that many worker processes run (their pid files
in the run directory) and, where the coordinator reports it, ``JobStatus.live_workers`` has reached
that many after a scale-up, plus ``--settle_s`` seconds (a new worker imports TensorFlow and pulls
the model first); then updates/s = growth of the coordinator's ``JobStatus.model_version`` (asked on PS
0's port, from ``RUN_DIR/ps-0.port``) over ``--window_s`` seconds. Medians of ``--repeats`` runs.

Writes ``bench/results/local_scaling.json`` (every sample), ``docs/scaling.md`` (its "Real node"
section, ``bench/node_scaling.py``'s, is kept) and
``docs/img/scaling.png`` (model version over time, scale requests marked). ``--mode sync|async``
picks the training mode of every job.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from elasticps.coordinator.client import CoordinatorClient

REPO = Path(__file__).resolve().parents[1]
JOB_NAME = "scaling"
SCENARIOS: dict[str, tuple[int, ...]] = {"scaled": (2, 4, 1), "fixed 4": (4,), "fixed 1": (1,)}
POLL_S = 0.25
MODES: dict[str, dict[str, object]] = {
    # The settings examples/mnist-async.yaml had when docs/scaling.md was measured (before issue 33).
    "async": {"useAsync": True, "lrStalenessModulation": True, "learningRate": 0.02, "getModelFrequency": 1},
    "sync": {},
}


@dataclass
class Phase:
    workers: int
    asked_s: float  # since the run started: when this worker count was asked (the start for phase 1)
    settled_s: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)
    updates_per_s: float = 0.0


@dataclass
class Run:
    scenario: str
    repetition: int
    phases: list[Phase] = field(default_factory=list)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, model_version)
    first_update_s: float = 0.0
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load before the run and at its end


def job_document(data: Path, mode: str, workers: int, ps: int) -> dict[str, Any]:
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB_NAME},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.mnist_cnn"},
            "data": {"reader": "idx", "training": str(data / "train"), "validation": str(data / "t10k")},
            "training": {"minibatchSize": 64, "numEpochs": 50, "recordsPerTask": 2048, **MODES[mode]},
            "ps": {"replicas": ps},
            "worker": {"replicas": workers},
            "runPolicy": {"backoffLimit": 3},
        },
    }


class Watch:
    """One running ``elasticps run``: its processes and its coordinator, sampled every POLL_S."""

    def __init__(self, run_dir: Path, run: Run, process: subprocess.Popen[bytes], log: Path) -> None:
        self.run_dir = run_dir
        self.run = run
        self.process = process
        self.log = log
        self.started = time.monotonic()
        self._client: CoordinatorClient | None = None
        self.live_workers = 0
        self.reports_live_workers = False  # the coordinator fills JobStatus.live_workers

    def now(self) -> float:
        return time.monotonic() - self.started

    def sample(self) -> int | None:
        """The model version now (also kept as a sample), None while PS 0 does not answer."""
        if self._client is None:
            port_file = self.run_dir / "ps-0.port"
            if not port_file.exists():
                return None
            self._client = CoordinatorClient(f"127.0.0.1:{int(port_file.read_text())}", worker="bench")
        try:
            status = self._client.status(timeout_s=2.0)
        except grpc.RpcError:
            return None
        version = int(status.model_version)
        self.live_workers = int(status.live_workers)
        self.reports_live_workers = self.reports_live_workers or self.live_workers > 0
        self.run.samples.append((round(self.now(), 3), version))
        return version

    def workers_running(self) -> set[int]:
        running = set()
        for pid_file in self.run_dir.glob(f"{JOB_NAME}-worker-*.pid"):
            try:
                status = Path(f"/proc/{int(pid_file.read_text())}/status").read_text()
            except (OSError, ValueError):
                continue
            if "zombie" not in status:
                running.add(int(pid_file.stem.rsplit("-", 1)[1]))
        return running

    def wait(self, seconds: float, until: Callable[[], bool] | None = None, what: str = "") -> None:
        """Samples for ``seconds`` or, with ``until``, until it holds (failing after ``seconds``)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])
                raise RuntimeError(f"{self.run.scenario}: elasticps run exited with code {self.process.returncode}:\n{tail}")
            self.sample()
            if until is not None and until():
                return
            time.sleep(POLL_S)
        if until is not None:
            raise RuntimeError(f"{self.run.scenario}: timed out after {seconds:.0f} s waiting for {what}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def rate(samples: list[tuple[float, int]], start: float, end: float) -> float:
    inside = [(t, v) for t, v in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return 0.0
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def measure(scenario: str, repetition: int, args: argparse.Namespace, scratch: Path) -> Run:
    counts = SCENARIOS[scenario]
    run = Run(scenario, repetition)
    run_dir = scratch / f"{scenario.replace(' ', '-')}-{repetition}"
    job_file = scratch / f"{run_dir.name}.yaml"
    job_file.write_text(yaml.safe_dump(job_document(args.data, args.mode, counts[0], args.ps)))
    log_path = scratch / f"{run_dir.name}.out"
    log = log_path.open("w")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "elasticps", "run", str(job_file), "--run_dir", str(run_dir)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    watch = Watch(run_dir, run, process, log_path)
    load_before = os.getloadavg()[0]
    try:
        watch.wait(args.start_timeout_s, lambda: (run.samples or [(0, 0)])[-1][1] > 0, "the first update")
        run.first_update_s = watch.now()
        for index, workers in enumerate(counts):
            if index:
                subprocess.run(
                    [sys.executable, "-m", "elasticps", "scale", str(run_dir), "--workers", str(workers)],
                    cwd=REPO, check=True, env=env, stdout=subprocess.DEVNULL,
                )
            phase = Phase(workers, asked_s=round(watch.now(), 3) if index else 0.0)
            wanted = set(range(workers))
            grew = index == 0 or workers > counts[index - 1]

            def settled() -> bool:
                heard = not (grew and watch.reports_live_workers) or watch.live_workers >= workers
                return heard and watch.workers_running() == wanted

            watch.wait(args.start_timeout_s, settled, f"{workers} workers")
            watch.wait(args.settle_s)
            phase.settled_s = round(watch.now(), 3)
            watch.wait(args.window_s)
            phase.window = (phase.settled_s, round(watch.now(), 3))
            phase.updates_per_s = round(rate(run.samples, *phase.window), 2)
            run.phases.append(phase)
            print(f"  {scenario} #{repetition}: {workers} workers, {phase.updates_per_s:.1f} updates/s", flush=True)
    finally:
        run.load_average = (round(load_before, 2), round(os.getloadavg()[0], 2))
        watch.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # stops every replica it started
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    return run


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    """Per scenario and phase: the median updates/s (min, max) and the median settling time."""
    rows = []
    for scenario, counts in SCENARIOS.items():
        for index, workers in enumerate(counts):
            phases = [r.phases[index] for r in runs if r.scenario == scenario and len(r.phases) > index]
            if not phases:
                continue
            rates = [p.updates_per_s for p in phases]
            rows.append({
                "scenario": scenario, "phase": index + 1, "workers": workers,
                "median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": len(rates),
                "settle_s": statistics.median(p.settled_s - p.asked_s for p in phases) if index else None,
            })
    return rows


def report(rows: list[dict[str, Any]], runs: list[Run], args: argparse.Namespace, elapsed_s: float) -> str:
    loads = [load for run in runs for load in run.load_average]
    fixed = {r["workers"]: r["median"] for r in rows if r["scenario"] != "scaled"}
    lines = [
        "# Scaling a running local job",
        "",
        f"Generated by `python -m bench.local_scaling --mode {args.mode}` (`bench/local_scaling.py`) on "
        f"{time.strftime('%Y-%m-%d')} in {elapsed_s:.0f} s, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); "
        "do not edit by hand, run it again. Every sample is in "
        "[`bench/results/local_scaling.json`](../bench/results/local_scaling.json).",
        "",
        f"mnist_cnn on MNIST, {args.mode}, {args.ps} PS, minibatch 64. *scaled* starts at 2 workers and is "
        "scaled to 4, then to 1, with `elasticps scale` while it trains; *fixed 4* and *fixed 1* keep their "
        f"workers. A phase is measured from when exactly its worker processes run (and, after a scale-up, "
        "the coordinator's `live_workers` reached that many, where it reports it) plus "
        f"{args.settle_s:g} s (settling), over {args.window_s:g} s; updates/s is the growth of the coordinator's model version. "
        f"Median of {args.repeats} interleaved run(s) per scenario, (min-max) in brackets. *settle* is the "
        "median time from `elasticps scale` to the start of the window. The machine's 1-minute load "
        f"average ranged {min(loads):.1f}-{max(loads):.1f} at the starts and ends of the runs, on "
        f"{os.cpu_count()} CPUs: the runs' own processes plus whatever else ran beside them.",
        "",
        "| scenario | phase | workers | updates/s | vs fixed | settle (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = fixed.get(r["workers"]) if r["scenario"] == "scaled" else None
        versus = f"{r['median'] / base:.2f}x" if base else "-"
        settle = "-" if r["settle_s"] is None else f"{r['settle_s']:.1f}"
        lines.append(
            f"| {r['scenario']} | {r['phase']} | {r['workers']} | {r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f})"
            f" | {versus} | {settle} |"
        )
    lines += ["", "![model version over time; scale requests marked](img/scaling.png)", ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    colours = {"scaled": "tab:blue", "fixed 4": "tab:green", "fixed 1": "tab:orange"}
    for run in runs:
        times = [t - run.first_update_s for t, _ in run.samples]
        label = run.scenario if run.repetition == 0 else None
        axis.plot(times, [v for _, v in run.samples], color=colours[run.scenario], alpha=0.8, label=label)
        if run.scenario != "scaled":
            continue
        for phase in run.phases[1:]:
            axis.axvline(phase.asked_s - run.first_update_s, color="black", linestyle="--", linewidth=0.8)
            axis.annotate(f"-> {phase.workers}", (phase.asked_s - run.first_update_s, 0), xytext=(3, 5),
                          textcoords="offset points", fontsize=8)
        for phase in run.phases:
            axis.axvspan(phase.window[0] - run.first_update_s, phase.window[1] - run.first_update_s,
                         color=colours["scaled"], alpha=0.06)
    axis.set_xlabel("seconds since the run's first update")
    axis.set_ylabel("model version (PS updates)")
    axis.set_xlim(left=0)
    axis.set_title("Workers scaled 2 -> 4 -> 1 while training (dashed: `elasticps scale`)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.local_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), required=True, help="the training mode of every job")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "mnist", help="MNIST idx folder")
    parser.add_argument("--ps", type=int, default=2, help="PS shards of every job")
    parser.add_argument("--repeats", type=int, default=3, help="runs per scenario (the table shows medians)")
    parser.add_argument("--settle_s", type=float, default=10.0, help="seconds after the processes match")
    parser.add_argument("--window_s", type=float, default=15.0, help="seconds of each measured window")
    parser.add_argument("--start_timeout_s", type=float, default=180.0, help="give up on a run after this")
    parser.add_argument("--out", type=Path, default=REPO, help="where bench/results and docs/ go")
    args = parser.parse_args(argv)
    args.data = args.data.resolve()
    if not (args.data / "train-images-idx3-ubyte.gz").exists():
        print(f"local_scaling: error: no MNIST in {args.data} (--data)", file=sys.stderr)
        return 2
    started = time.monotonic()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="elasticps-scaling-") as scratch:
        for repetition in range(args.repeats):
            for scenario in SCENARIOS:
                runs.append(measure(scenario, repetition, args, Path(scratch)))
    rows = summarize(runs)
    results = args.out / "bench" / "results" / "local_scaling.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results.write_text(json.dumps({"settings": settings, "summary": rows, "runs": [asdict(r) for r in runs]}, indent=1))
    plot(runs, args.out / "docs" / "img" / "scaling.png")
    text = report(rows, runs, args, time.monotonic() - started)
    doc = args.out / "docs" / "scaling.md"
    # bench/node_scaling.py's section (the real node) stays.
    kept = doc.read_text().partition("\n## Real node")[1:] if doc.exists() else ("", "")
    doc.write_text(text + "".join(kept))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
