"""``make bench-heterogeneity``: every training mode under every kind of slowdown, on one job.

    python -m bench.heterogeneity [--job examples/mnist.yaml] [--repeats 3] [--epochs 2]
                                  [--modes sync,localsgd4,...] [--slowdowns none,straggler4,...]
                                  [--worker_cpus 0.4] [--merge] [--no_write]

The modes and slowdowns, and the job each pair runs, are ``bench.heterogeneity_jobs``'s. Each
repetition runs every (slowdown, mode) pair once through ``elasticps run``, the order rotated by one
pair per repetition, measured by ``bench.peer_runs`` with the coordinator polled throughout. Per run
(:func:`run_figures`): wall time to 97% and to 98% test accuracy (the first poll that shows an
evaluation at or above it), the final accuracy, model updates per second and tensor bytes in epoch 2,
the accuracy and LocalSGD's K over wall time, and PS 0's staleness histogram (every push, with the
share of stale pushes and the 90th percentile). Writes ``bench/results/heterogeneity.json``, the
generated region of ``docs/heterogeneity.md`` and its plots (``bench.heterogeneity_report``); the
results file after every run as well. ``--merge`` keeps the file's runs of the pairs this invocation
does not run, so the slowdowns can be measured in separate sittings.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench import cpu_caps
from bench import heterogeneity_jobs as jobs
from bench import heterogeneity_report as report
from bench.peer_runs import RunFailed, run_elasticps
from bench.peer_timeline import IncompleteRun

ROOT = Path(__file__).resolve().parent.parent
THRESHOLDS = (0.97, 0.98)


def time_to(samples: Sequence[Mapping[str, Any]], threshold: float) -> float | None:
    """Seconds from the start to the first answer showing an evaluation at or above ``threshold``."""
    for sample in samples:
        accuracy = sample.get("accuracy")
        if accuracy is not None and accuracy >= threshold:
            return float(sample["t"])
    return None


def curve(samples: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float, float]]:
    """``(t, value)`` at each change of ``key`` (accuracy, local_steps) over the run."""
    points: list[tuple[float, float]] = []
    for sample in samples:
        value = sample.get(key)
        if value is None or (points and points[-1][1] == value):
            continue
        points.append((round(float(sample["t"]), 2), float(value)))
    return points


def updates_per_s(samples: Sequence[Mapping[str, Any]], epoch2: Mapping[str, Any], ended_epoch1: float) -> float | None:
    """Model versions per second over epoch 2 (PS 0's version)."""
    inside = [s for s in samples if ended_epoch1 <= s["t"] <= epoch2["ended_s"]]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        return None
    versions = float(inside[-1]["model_version"] - inside[0]["model_version"])
    return versions / float(inside[-1]["t"] - inside[0]["t"])


def slowest_iterations_per_s(samples: Sequence[Mapping[str, Any]], epoch2: Mapping[str, Any], ended_epoch1: float) -> float | None:
    """Decentralized: the slowest live worker's iterations per second over epoch 2 (None: not known)."""
    inside = [s for s in samples if ended_epoch1 <= s["t"] <= epoch2["ended_s"] and s.get("min_iteration", -1) >= 0]
    if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
        return None
    return float(inside[-1]["min_iteration"] - inside[0]["min_iteration"]) / float(inside[-1]["t"] - inside[0]["t"])


def staleness_figures(buckets: Sequence[Sequence[int | None]]) -> dict[str, float | None]:
    """From PS 0's ``[lowest, highest, pushes]`` buckets: the share of pushes computed on an older
    model than the shard's (staleness > 0), and the staleness 90% of pushes are at or below (the
    bucket's highest; its lowest for the open last bucket). None when nothing was pushed."""
    total = sum(int(n or 0) for _, _, n in buckets)
    if total == 0:
        return {"stale_share": None, "staleness_p90": None}
    stale = sum(int(n or 0) for low, _, n in buckets if (low or 0) > 0)
    seen = 0
    p90: float | None = None
    for low, high, n in buckets:
        seen += int(n or 0)
        if seen >= 0.9 * total:
            p90 = float(high if high is not None else low or 0)
            break
    return {"stale_share": stale / total, "staleness_p90": p90}


def run_figures(measured: Mapping[str, Any]) -> dict[str, Any]:
    """What the table and the plots take from one measured run (``run_elasticps(keep_samples=True)``)."""
    samples = sorted(measured["samples"], key=lambda s: s["t"])
    epochs = measured["epochs"]
    second = epochs[1] if len(epochs) > 1 else None
    reached = {t: time_to(samples, t) for t in THRESHOLDS}
    first_step = measured["first_step_s"]
    return {
        **{f"time_to_{round(t * 100)}_s": reached[t] for t in THRESHOLDS},
        "first_step_s": first_step,
        # the same, from the first training step (process and model start-up are alike in every mode)
        "training_to_98_s": None if reached[0.98] is None or first_step is None else reached[0.98] - first_step,
        "wall_s": measured["wall_s"],
        "test_accuracy": measured["test_accuracy"],
        "updates_per_s_epoch2": None if second is None else updates_per_s(samples, second, epochs[0]["ended_s"]),
        "slowest_iterations_per_s_epoch2": None if second is None else slowest_iterations_per_s(samples, second, epochs[0]["ended_s"]),
        "tensor_bytes_epoch2": measured["tensor_bytes_epoch2"],
        "tensor_bytes_per_epoch": [e["tensor_bytes"] for e in epochs],
        "examples_per_s_epoch2": measured["examples_per_s_epoch2"],
        "accuracy_curve": curve(samples, "accuracy"),
        "local_steps_curve": curve(samples, "local_steps"),
        "gradients_rejected": measured["gradients_rejected"],
        "staleness": measured["staleness"],
        **staleness_figures(measured["staleness"]),
    }


def pairs_in_order(repetition: int, slowdowns: Sequence[jobs.Slowdown], modes: Sequence[jobs.Mode]) -> list[tuple[jobs.Slowdown, jobs.Mode]]:
    """Every (slowdown, mode) pair once, starting one further along at each repetition."""
    pairs = [(s, m) for s in slowdowns for m in modes]
    shift = repetition % len(pairs)
    return pairs[shift:] + pairs[:shift]


def _keys(text: str, known: Mapping[str, Any], what: str, parser: argparse.ArgumentParser) -> list[Any]:
    chosen = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in known]
    if unknown or not chosen:
        parser.error(f"--{what}: unknown {unknown} (known: {', '.join(known)})")
    return [known[k] for k in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "mnist.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="at least 2: updates/s and bytes are of epoch 2")
    parser.add_argument("--modes", default=",".join(jobs.MODE_BY_KEY))
    parser.add_argument("--slowdowns", default=",".join(jobs.SLOWDOWN_BY_KEY))
    parser.add_argument("--no_write", action="store_true", help="print only: no results file, doc or plot")
    parser.add_argument(
        "--worker_cpus", type=float, default=None,
        help="hold each worker to this many CPUs, as on a machine of its own (bench.cpu_caps; root)",
    )
    parser.add_argument(
        "--merge", action="store_true",
        help="keep the runs of bench/results/heterogeneity.json of other (slowdown, mode) pairs",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 2:
        parser.error("--repeats >= 1 and --epochs >= 2")
    if args.worker_cpus is not None and (args.worker_cpus <= 0 or cpu_caps.unavailable()):
        parser.error(f"--worker_cpus: must be > 0 and need a cgroup cpu controller ({cpu_caps.unavailable()})")
    modes = _keys(args.modes, jobs.MODE_BY_KEY, "modes", parser)
    slowdowns = _keys(args.slowdowns, jobs.SLOWDOWN_BY_KEY, "slowdowns", parser)
    document = yaml.safe_load(args.job.read_text())
    os.chdir(ROOT)  # the job's relative data paths are relative to the repository
    from elasticps.api.parsing import SpecError, load_job_file
    from elasticps.data.readers import DataError, count_records

    try:
        records, _ = count_records(load_job_file(args.job.resolve()).spec.data)
    except (SpecError, DataError) as err:
        print(f"bench.heterogeneity: {args.job}: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    earlier = report.earlier_runs(modes, slowdowns) if args.merge else {"modes": {}, "slowdowns": {}, "runs": []}

    def document_so_far() -> dict[str, Any]:
        every = [*earlier["runs"], *runs]
        return {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "runtime_s": round(time.monotonic() - started, 1),
            "job": str(args.job),
            "repeats": args.repeats,
            "epochs": args.epochs,
            "workers": jobs.WORKERS,
            "ps": jobs.PS_REPLICAS,
            "worker_cpus": args.worker_cpus,
            "complete": len(runs) == total,
            "merged_runs": len(earlier["runs"]),
            "modes": {m.key: m.label for m in jobs.MODES if m in modes or m.key in earlier["modes"]},
            "slowdowns": {s.key: s.label for s in jobs.SLOWDOWNS if s in slowdowns or s.key in earlier["slowdowns"]},
            "summary": report.aggregate(every),
            "runs": every,
        }

    total = args.repeats * len(modes) * len(slowdowns)
    with tempfile.TemporaryDirectory(prefix="elasticps-heterogeneity-") as tmp:
        for repetition in range(args.repeats):
            for slowdown, mode in pairs_in_order(repetition, slowdowns, modes):
                work = Path(tmp) / f"{repetition}-{slowdown.key}-{mode.key}"
                work.mkdir()
                job = work / "job.yaml"
                job.write_text(yaml.safe_dump(jobs.derive(document, mode, slowdown, records, args.epochs), sort_keys=False))
                label = f"[{len(runs) + 1}/{total}] {slowdown.label}, {mode.label}"
                try:
                    measured = run_elasticps(job, work, args.epochs, keep_samples=True, worker_cpus=args.worker_cpus)
                    figures = run_figures(measured)
                except (RunFailed, IncompleteRun) as err:
                    print(f"{label}: FAILED: {err}", flush=True)
                    runs.append({"repetition": repetition + 1, "slowdown": slowdown.key, "mode": mode.key, "failed": str(err)})
                    continue
                runs.append({"repetition": repetition + 1, "slowdown": slowdown.key, "mode": mode.key, **figures})
                print(f"{label}: {report.run_line(figures)}", flush=True)
                if not args.no_write:
                    report.save(document_so_far())  # a run cut short keeps what it measured
    doc = document_so_far()
    for line in report.verdict_lines(doc):
        print(line)
    if not args.no_write:
        report.write(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
