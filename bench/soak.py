"""``make soak`` (``python -m bench.soak``): 32 async workers for 5 minutes against 2 PS while a fuzzer
sends malformed calls at 10/s (issue 13).

The job is ``elasticps.tools.scale_job``'s: 2 ``elasticps ps`` processes, the workers as threads of
``--processes`` fake-worker processes (the real worker loop and clients, a numpy model), with
enough epochs that it never ends on its own; it is stopped after ``--minutes``. Meanwhile:

* the fuzzer (a thread here) sends ``bench/malformed.py``'s cases round-robin, ``--fuzz_per_s`` a
  second: the PS cases built for the shard they go to (its own variables' names and shapes), the
  coordinator's to PS 0; cases a correct server answers OK are left out (they are not malformed), and
  a report's task id is one never handed out, so no real task is touched;
* every ``--sample_s`` seconds the sampler reads each PS's resident memory (``VmRSS`` in
  ``/proc/<pid>/status``), pulls the whole model and checks every value is finite, and asks the
  coordinator for its status.

Legitimate calls are the workers' (every attempt, counted by an interceptor on their clients) and
the sampler's; a failed one is any attempt that did not end OK, or a worker whose loop raised.
Memory is flat when every sample after the first minute is within 10% of the one at minute 1.

Writes ``bench/results/soak.json`` (every sample), ``docs/img/soak.png`` (resident memory and calls
per second over time) and the soak section of ``docs/reliability.md`` (what follows its
``## Scale tests`` heading is kept). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench import malformed
from elasticps.api.spec import MAX_EPOCHS, TrainingSpec
from elasticps.coordinator.client import CoordinatorClient
from elasticps.proto import elasticps_pb2 as pb
from elasticps.psclient.client import PSClient
from elasticps.rpc.channels import create_channel
from elasticps.tools.fake_trainer import initial_model, layout
from elasticps.tools.scale_job import ScaleJob, Summary, summarize

REPO = Path(__file__).resolve().parents[1]
MINIBATCH = 4
RECORDS = 10_000
FLAT_WITHIN = 0.10  # memory after minute 1 stays within this fraction of its value at minute 1
NEVER_HANDED_OUT = 10**12  # the task id of a malformed report: no real task is touched
# Malformed only against the task it reports (its records are not the task's): with a task id never
# handed out there is nothing to compare, and the report of an unknown task is answered OK.
TASK_RELATIVE = {"report: records other than the task's"}


@dataclass
class Sample:
    t: float  # seconds since the workers started
    rss_kib: list[int]  # per PS
    finite: bool
    model_version: int
    shard_versions: list[int]


@dataclass
class Sampler:
    """Reads memory, the model and the status; its own calls count as legitimate calls."""

    job: ScaleJob
    samples: list[Sample] = field(default_factory=list)
    calls: int = 0
    failed: list[str] = field(default_factory=list)

    def sample(self, t: float, ps: PSClient, coordinator: CoordinatorClient) -> Sample:
        rss = [rss_kib(p.pid) for p in self.job.ps]
        finite, version, shards = True, -1, [-1] * len(self.job.ps)
        try:
            self.calls += len(self.job.ps)  # a pull asks every shard
            pulled = ps.pull([-1] * len(self.job.ps))
            finite = all(bool(np.isfinite(v).all()) for v in pulled.tensors.values())
            self.calls += 1
            status = coordinator.status(timeout_s=10.0)
            version, shards = int(status.model_version), [int(v) for v in status.shard_versions]
        except grpc.RpcError as err:
            self.failed.append(f"{t:.0f} s: {err}")
        sample = Sample(t, rss, finite, version, shards)
        self.samples.append(sample)
        return sample


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---- the fuzzer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shot:
    name: str
    service: str
    shard: int
    method: str
    request: list[bytes] | bytes


def shots(num_ps: int) -> list[Shot]:
    """Every malformed call the fuzzer sends, in the order it sends them."""
    weights, state = initial_model(num_ps)
    out: list[Shot] = []
    for shard in range(num_ps):
        names = layout(shard, num_ps)
        target = malformed.Target(names.matrix, names.vector, names.state, weights[names.matrix],
                                  weights[names.vector], state[names.state])  # fmt: skip
        for name, case in malformed.ps_cases(target).items():
            if case.code is not malformed.OK and "async" in case.modes:
                out.append(Shot(f"ps-{shard} {name}", malformed.PS_SERVICE, shard, case.method, case.request))
    for name, ccase in malformed.COORD_CASES.items():
        if ccase.code is malformed.OK or ccase.sync or name in TASK_RELATIVE:
            continue
        request = ccase.request
        if ccase.task:
            result = pb.TaskResult.FromString(request)
            result.task_id = NEVER_HANDED_OUT
            request = result.SerializeToString()
        out.append(Shot(f"coordinator {name}", malformed.COORDINATOR, 0, ccase.method, request))
    return out


class Fuzzer(threading.Thread):
    def __init__(self, addresses: list[str], per_s: float) -> None:
        super().__init__(name="fuzzer", daemon=True)
        self._channels = [create_channel(a) for a in addresses]
        self.shots = shots(len(addresses))
        self._period = 1.0 / per_s
        self._stopping = threading.Event()
        self.sent = 0
        self.codes: Counter[str] = Counter()
        self.taken: Counter[str] = Counter()  # malformed calls answered OK (none, from a correct server)

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stopping.is_set():
            shot = self.shots[self.sent % len(self.shots)]
            code, _ = malformed.call(self._channels[shot.shard], shot.service, shot.method, shot.request, timeout_s=10.0)
            self.sent += 1
            self.codes[code.name] += 1
            if code is grpc.StatusCode.OK:
                self.taken[shot.name] += 1
            next_at += self._period
            self._stopping.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)
        for channel in self._channels:
            channel.close()


# ---- the run -------------------------------------------------------------------------------------


def calls_per_s(
    directory: Path, reports: list[dict[str, Any]], times: list[float], started_wall: float
) -> list[float]:
    """The workers' call attempts per second up to each sample time, every process summed (from
    their progress lines and their final reports, each process's running total interpolated)."""
    total = np.zeros(len(times))
    for i, final in enumerate(reports):
        path = directory / f"w{i}.progress"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        at = [line["t"] - started_wall for line in [*lines, final]]
        made = [sum(n for codes in line["calls"].values() for n in codes.values()) for line in [*lines, final]]
        total += np.interp(times, [0.0, *at], [0, *made])
    rates = np.diff([0.0, *total]) / np.maximum(np.diff([0.0, *times]), 1e-9)
    return [float(r) for r in rates]


def soak(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    minutes = float(args.minutes)
    # Enough epochs that the job outlasts the soak at a few thousand records a second.
    epochs = min(MAX_EPOCHS, max(2, math.ceil(minutes * 60 * 5000 / RECORDS)))
    spec = TrainingSpec(use_async=True, minibatch_size=MINIBATCH, records_per_task=20 * MINIBATCH,
                        num_epochs=epochs, learning_rate=1.0)  # fmt: skip
    per_process = args.workers // args.processes
    with ScaleJob(directory, spec, RECORDS) as job:
        addresses = job.start_ps()
        started_wall, started = time.time(), time.monotonic()
        job.start_workers(args.processes, per_process, progress_s=args.sample_s)
        fuzzer = Fuzzer(addresses, args.fuzz_per_s)
        fuzzer.start()
        sampler = Sampler(job)
        ps = PSClient(addresses, worker="soak-sampler", deadline_s=30.0, timeout_s=30.0)
        coordinator = CoordinatorClient(addresses[0], worker="soak-sampler", deadline_s=30.0)
        try:
            end = started + minutes * 60
            while time.monotonic() < end:
                time.sleep(max(0.0, min(args.sample_s, end - time.monotonic())))
                s = sampler.sample(time.monotonic() - started, ps, coordinator)
                print(f"{s.t:6.0f} s  rss {[r // 1024 for r in s.rss_kib]} MiB  version {s.model_version}  "
                      f"finite {s.finite}  fuzz {fuzzer.sent}", flush=True)  # fmt: skip
            fuzzer.stop()
            reports = job.stop_workers()
            after = sampler.sample(time.monotonic() - started, ps, coordinator)  # the model once everyone stopped
            sampler.samples.pop()
        finally:
            ps.close()
            coordinator.close()
        exited = [p.poll() for p in job.ps]
        summary = summarize(reports)
        times = [s.t for s in sampler.samples]
        rates = calls_per_s(directory, reports, times, started_wall)
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        "settings": {"minutes": minutes, "workers": per_process * args.processes, "processes": args.processes,
                     "fuzz_per_s": args.fuzz_per_s, "sample_s": args.sample_s, "minibatch": MINIBATCH,
                     "records": RECORDS, "epochs": epochs},  # fmt: skip
        "summary": asdict(summary) | {"push_seconds": None},
        "legitimate_calls": summary.total_calls() + sampler.calls,
        "failed_legitimate_calls": summary.failed_calls() + len(summary.errors) + len(sampler.failed),
        "sampler_failures": sampler.failed,
        "fuzz": {"sent": fuzzer.sent, "codes": dict(fuzzer.codes), "taken": dict(fuzzer.taken),
                 "cases": len(fuzzer.shots)},  # fmt: skip
        "ps_alive_at_end": [code is None for code in exited],
        "after_stop": asdict(after),
        "samples": [asdict(s) | {"calls_per_s": r} for s, r in zip(sampler.samples, rates)],
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


# ---- verdicts and outputs ------------------------------------------------------------------------


def memory_at(samples: list[dict[str, Any]], t: float) -> list[int]:
    """Each PS's resident memory (KiB) at the sample nearest ``t`` seconds."""
    nearest = min(samples, key=lambda s: abs(s["t"] - t))
    return list(nearest["rss_kib"])


def verdicts(doc: dict[str, Any]) -> dict[str, Any]:
    samples = doc["samples"]
    minute_1 = memory_at(samples, 60.0)
    later = [s for s in samples if s["t"] >= 60.0] or samples[-1:]
    drift = [max(abs(s["rss_kib"][i] - m) / m for s in later) for i, m in enumerate(minute_1)]
    return {
        "memory_minute_1_kib": minute_1,
        "memory_end_kib": list(samples[-1]["rss_kib"]),
        "memory_drift_after_minute_1": drift,
        "memory_flat": all(d <= FLAT_WITHIN for d in drift),
        "no_failed_legitimate_calls": doc["failed_legitimate_calls"] == 0,
        "finite_throughout": all(s["finite"] for s in samples) and doc["after_stop"]["finite"],
        "ps_alive": all(doc["ps_alive_at_end"]),
        "every_worker_reported": doc["summary"]["workers"] == doc["settings"]["workers"],
        "no_malformed_call_taken": not doc["fuzz"]["taken"],
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = doc["samples"]
    times = [s["t"] for s in samples]
    figure, (memory, rate) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for i in range(len(samples[0]["rss_kib"])):
        memory.plot(times, [s["rss_kib"][i] / 1024 for s in samples], label=f"PS {i}")
    memory.axvline(60, color="black", linestyle="--", linewidth=0.8, label="minute 1")
    memory.set_ylabel("resident memory (MiB)")
    memory.set_ylim(bottom=0)
    memory.grid(alpha=0.3)
    memory.legend()
    rate.plot(times, [s["calls_per_s"] for s in samples], color="tab:green", label="workers' calls/s")
    rate.set_ylabel("legitimate calls per second")
    rate.set_xlabel("seconds since the workers started")
    rate.set_ylim(bottom=0)
    rate.grid(alpha=0.3)
    s = doc["settings"]
    memory.set_title(f"Soak: {s['workers']} async workers, 2 PS, malformed calls at {s['fuzz_per_s']:g}/s")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def report(doc: dict[str, Any], verdict: dict[str, Any]) -> str:
    s, summary, fuzz = doc["settings"], doc["summary"], doc["fuzz"]
    mib = lambda kib: f"{kib / 1024:.1f}"  # noqa: E731
    m1, end = verdict["memory_minute_1_kib"], verdict["memory_end_kib"]
    ok = lambda flag: "yes" if flag else "**NO**"  # noqa: E731
    lines = [
        "# Reliability",
        "",
        "How the PS and the coordinator hold up under load and hostile input (issue 13). The soak section is",
        "written by `make soak` (`bench/soak.py`); the scale tests' figures come from `make test`",
        "(`tests/scale/test_scale_jobs.py`).",
        "",
        "## Soak",
        "",
        f"`make soak` ({doc['date'][:16]}, {doc['machine']['cpus']} CPUs): {s['workers']} async workers (threads of "
        f"{s['processes']} processes, the real worker loop and clients with a numpy model) against 2 PS processes "
        f"for {s['minutes']:g} minutes, while a fuzzer sent {fuzz['sent']} malformed calls "
        f"({fuzz['cases']} cases, round-robin, {s['fuzz_per_s']:g}/s).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| legitimate calls made (every attempt) | {doc['legitimate_calls']} |",
        f"| failed legitimate calls | {doc['failed_legitimate_calls']} |",
        f"| gradients pushed (all accepted) | {summary['pushes']} ({summary['pushes_accepted']}) |",
        f"| push latency p50 / p99 / max | {summary['push_p50_s'] * 1000:.1f} / {summary['push_p99_s'] * 1000:.1f} / "
        f"{summary['push_max_s'] * 1000:.1f} ms |",
        f"| PS memory at minute 1 (PS 0, PS 1) | {mib(m1[0])}, {mib(m1[1])} MiB |",
        f"| PS memory at the end, minute {s['minutes']:g} | {mib(end[0])}, {mib(end[1])} MiB |",
        f"| largest drift after minute 1 | {', '.join(f'{d:.1%}' for d in verdict['memory_drift_after_minute_1'])} |",
        f"| malformed calls answered | {', '.join(f'{c} {n}' for c, n in sorted(fuzz['codes'].items()))} |",
        f"| malformed calls taken (answered OK) | {sum(fuzz['taken'].values())} |",
        "",
        f"- zero failed legitimate calls: {ok(verdict['no_failed_legitimate_calls'])}",
        f"- PS memory flat within {FLAT_WITHIN:.0%} after the first minute: {ok(verdict['memory_flat'])}",
        f"- the model finite at every sample ({len(doc['samples'])}, every {s['sample_s']:g} s): "
        f"{ok(verdict['finite_throughout'])}",
        f"- both PS alive at the end: {ok(verdict['ps_alive'])}; every worker process reported: "
        f"{ok(verdict['every_worker_reported'])}",
        "",
        "![PS resident memory and the workers' calls per second over the soak](img/soak.png)",
        "",
        "Data: `bench/results/soak.json`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the workers train")
    parser.add_argument("--workers", type=int, default=32, help="async workers")
    parser.add_argument("--processes", type=int, default=2, help="processes the workers are threads of")
    parser.add_argument("--fuzz_per_s", type=float, default=10.0, help="malformed calls per second")
    parser.add_argument("--sample_s", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=REPO, help="where bench/results and docs/ go")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="elasticps-soak-") as scratch:
        doc = soak(args, Path(scratch))
    verdict = verdicts(doc)
    doc["verdicts"] = verdict
    results = args.out / "bench" / "results" / "soak.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(doc, indent=1))
    plot(doc, args.out / "docs" / "img" / "soak.png")
    path = args.out / "docs" / "reliability.md"
    kept = path.read_text().partition("\n## Scale tests")[1:] if path.exists() else ("", "")
    text = report(doc, verdict)
    path.write_text(text + "".join(kept))
    print(text)
    failed = [name for name, flag in verdict.items() if flag is False]
    if failed:
        print(f"soak: failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
