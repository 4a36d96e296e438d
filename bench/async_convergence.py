"""``make bench-async``: how reliably each asynchronous mode converges, seed by seed, beside sync.

    python -m bench.async_convergence [--modes sync,async,...] [--settings peer,example]
                                      [--workers 2,8] [--seeds 1-10] [--epochs 2] [--merge]

Every run trains ``examples/mnist.yaml`` (mnist_cnn, SGD with momentum 0.9) through ``elasticps
run`` with only these changed: the mode's fields, the setting's learning rate, the workers (2
workers on 1 PS, 8 on 2 PS), ``spec.training.seed`` (the model's initial weights and the order of
tasks and minibatches), no output, no checkpoints, about 8 evaluations per epoch. The settings:
``peer``, lr 0.05 (the model's and TensorFlow ParameterServerStrategy's in ``make bench-peer``), and
``example``, the learning rate of ``examples/mnist-async.yaml`` (``lr<rate>``: any other). Seeds are the outer loop and the
(setting, workers, mode) cells rotate by one per seed, so every cell meets the machine's noise alike
and a reader reruns one cell and seed with ``--modes M --settings S --workers W --seeds N``.

Per cell: the share of runs reaching 97% and 98% test accuracy, the median time to 98%, the final
accuracy's spread, and the median model updates per second in epoch 2 against plain
uncompensated async's in the same cell. Writes ``bench/results/async_convergence.json`` (after
every run), the ``async-convergence`` region of ``docs/convergence.md`` and
``docs/img/async-convergence.png`` (the median run's accuracy over time per mode).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.doc_regions import write_region
from bench.heterogeneity import run_figures
from bench.peer_runs import RunFailed, run_elasticps
from bench.peer_timeline import IncompleteRun

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "mnist.yaml"
EXAMPLE = ROOT / "examples" / "mnist-async.yaml"
RESULTS = ROOT / "bench" / "results" / "async_convergence.json"
DOC = ROOT / "docs" / "convergence.md"
PLOT = ROOT / "docs" / "img" / "async-convergence.png"
REGION = "async-convergence"
EVALUATIONS_PER_EPOCH = 8
PEER_LR = 0.05
BASELINE = "async-none"  # updates/s are compared with this mode's, in the same (setting, workers)


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    training: Mapping[str, Any] = field(default_factory=dict)
    minibatches_per_version: float = 1.0  # sync: one version per round of all workers' minibatches


def ssp(k: int) -> Mode:
    return Mode(f"ssp{k}", f"SSP k={k}", {"useAsync": True, "getModelFrequency": k})


MODES = (
    Mode("sync", "sync (reference)", {}, 0.0),  # 0: the workers' count, filled in by derive
    Mode("async-none", "async, uncompensated", {"useAsync": True, "stalenessCompensation": "none"}),
    Mode("async", "async (default: momentumCorrection)", {"useAsync": True}),
    Mode(
        "async-lr-none",
        "async + staleness lr, uncompensated",
        {"useAsync": True, "lrStalenessModulation": True, "stalenessCompensation": "none"},
    ),
    Mode("async-lr", "async + staleness lr + momentumCorrection", {"useAsync": True, "lrStalenessModulation": True}),
    ssp(2),
    ssp(4),
    ssp(8),
)
MODE_BY_KEY = {m.key: m for m in MODES}
WORKERS = {2: 1, 4: 1, 8: 2}  # workers: PS replicas


def example_lr(path: Path = EXAMPLE) -> float:
    """The learning rate the shipped async example trains with (0: the model's, the peer's)."""
    training = yaml.safe_load(path.read_text()).get("spec", {}).get("training", {})
    return float(training.get("learningRate", 0.0)) or PEER_LR


def settings() -> dict[str, float]:
    """The learning rates by name; the example's only where it differs from the peer's (since
    issue 33 the example trains at the model's own rate, the peer's)."""
    example = example_lr()
    return {"peer": PEER_LR} if example == PEER_LR else {"peer": PEER_LR, "example": example}


def derive(document: Mapping[str, Any], mode: Mode, lr: float, workers: int, seed: int, records: int, epochs: int) -> dict[str, Any]:
    """The TrainingJob of one run; ``document`` (a parsed TrainingJob) is left unchanged. Pure."""
    job = copy.deepcopy(dict(document))
    metadata = job.setdefault("metadata", {})
    metadata["name"] = f"{metadata.get('name', 'job')}-{mode.key}-{workers}w-s{seed}"
    spec = job.setdefault("spec", {})
    spec.pop("output", None)
    spec.pop("prediction", None)
    spec.setdefault("ps", {})["replicas"] = WORKERS[workers]
    spec.setdefault("worker", {})["replicas"] = workers
    training = spec.setdefault("training", {})
    for key in ("exportSteps", "gradsToWait", "useAsync", "lrStalenessModulation", "getModelFrequency",
                "stalenessCompensation", "overlapPull"):  # fmt: skip
        training.pop(key, None)
    training.update(mode.training)
    training.update({"checkpointSteps": 0, "numEpochs": epochs, "learningRate": lr, "seed": seed})
    per_version = mode.minibatches_per_version or workers
    versions_per_epoch = records / int(training.get("minibatchSize", 64)) / per_version
    training["evaluationSteps"] = max(1, round(versions_per_epoch / EVALUATIONS_PER_EPOCH))
    return job


def cells_in_order(seed_index: int, cells: Sequence[tuple[str, int, Mode]]) -> list[tuple[str, int, Mode]]:
    """Every (setting, workers, mode) once, starting one further along at each seed."""
    shift = seed_index % len(cells)
    return [*cells[shift:], *cells[:shift]]


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell ``setting/workers/mode``: counts, shares, medians and spread. Pure."""
    cells: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        cells.setdefault(f"{run['setting']}/{run['workers']}/{run['mode']}", []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for key, members in cells.items():
        done = [r for r in members if "failed" not in r]
        finals = [float(r["test_accuracy"]) for r in done if r.get("test_accuracy") is not None]
        out[key] = {
            "runs": len(members),
            "failed": len(members) - len(done),
            "reached_97": sum(1 for r in done if r.get("time_to_97_s") is not None),
            "reached_98": sum(1 for r in done if r.get("time_to_98_s") is not None),
            "median_time_to_98_s": _median([r.get("time_to_98_s") for r in done]),
            "median_accuracy": _median(finals),
            "min_accuracy": min(finals) if finals else None,
            "max_accuracy": max(finals) if finals else None,
            "median_updates_per_s": _median([r.get("updates_per_s_epoch2") for r in done]),
            "median_wall_s": _median([r.get("wall_s") for r in done]),
        }
    for key, cell in out.items():
        setting, workers, _ = key.split("/")
        base = out.get(f"{setting}/{workers}/{BASELINE}", {}).get("median_updates_per_s")
        mine = cell["median_updates_per_s"]
        cell["updates_vs_uncompensated"] = None if not base or mine is None else mine / base
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def table(doc: Mapping[str, Any]) -> str:
    summary: Mapping[str, Mapping[str, Any]] = doc["summary"]
    lines = [
        f"Generated by `make bench-async` (`bench/async_convergence.py`) on {doc['date'][:10]}: "
        f"{len(doc['runs'])} runs of `examples/mnist.yaml`, {doc['epochs']} epochs each, seeds "
        f"{_seed_text(sorted({int(r['seed']) for r in doc['runs'] if 'seed' in r}))} (each cell's are in its runs); every run is in [`bench/results/async_convergence.json`](../bench/results/async_convergence.json). "
        f"Learning rates: {', '.join(f'{k} {v:g}' for k, v in doc['settings'].items())} (momentum 0.9, the model's).",
        "",
        "| setting | workers (PS) | mode | runs | reach 97% | reach 98% | median s to 98% | final accuracy: median (min-max) "
        "| updates/s, epoch 2 | vs uncompensated |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for key in sorted(summary, key=_cell_order):
        setting, workers, mode = key.split("/")
        c = summary[key]
        done = c["runs"] - c["failed"]
        spread = f"{_pct(c['median_accuracy'])} ({_pct(c['min_accuracy'])}-{_pct(c['max_accuracy'])})"
        ratio = "-" if c["updates_vs_uncompensated"] is None else f"{c['updates_vs_uncompensated']:.2f}x"
        ups = "-" if c["median_updates_per_s"] is None else f"{c['median_updates_per_s']:.1f}"
        to98 = "-" if c["median_time_to_98_s"] is None else f"{c['median_time_to_98_s']:.1f}"
        failed = f" ({c['failed']} failed)" if c["failed"] else ""
        lines.append(
            f"| {setting} | {workers} ({WORKERS[int(workers)]}) | {MODE_BY_KEY[mode].label} | {c['runs']}{failed} "
            f"| {c['reached_97']}/{done} | {c['reached_98']}/{done} | {to98} | {spread} | {ups} | {ratio} |"
        )
    lines += ["", "![test accuracy over time, the median run of each mode](img/async-convergence.png)"]
    return "\n".join(lines)


def _seed_text(seeds: Sequence[int]) -> str:
    """1-10, or 1-5, 8 ..."""
    parts: list[str] = []
    for seed in seeds:
        if parts and seed == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{seed}"
        else:
            parts.append(str(seed))
    return ", ".join(parts) or "none"


def _cell_order(key: str) -> tuple[str, int, int]:
    setting, workers, mode = key.split("/")
    return setting, int(workers), [m.key for m in MODES].index(mode)


def plot(doc: Mapping[str, Any], path: Path = PLOT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["setting"], r["workers"]) for r in doc["runs"]})
    if not panels:
        return
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for axis, (setting, workers) in zip(axes[0], panels):
        for mode in MODES:
            runs = [r for r in doc["runs"] if (r["setting"], r["workers"], r["mode"]) == (setting, workers, mode.key)
                    and "failed" not in r and r.get("test_accuracy") is not None]  # fmt: skip
            if not runs:
                continue
            runs.sort(key=lambda r: float(r["test_accuracy"]))
            median = runs[len(runs) // 2]
            points = median["accuracy_curve"]
            axis.plot(
                [t for t, _ in points], [a for _, a in points], ".-",
                label=f"{mode.label} ({len(runs)} runs; median final {float(median['test_accuracy']):.4f})",
            )  # fmt: skip
        axis.axhline(0.98, color="black", linestyle="--", linewidth=1)
        axis.set_ylim(0.9, 1.0)
        axis.set_xlabel("seconds since `elasticps run` started")
        axis.set_ylabel("test accuracy (the median run)")
        axis.set_title(f"{setting} lr {doc['settings'][setting]:g}, {workers} workers, {WORKERS[workers]} PS")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    if not out or min(out) < 1:
        raise ValueError("seeds are integers >= 1")
    return out


def _earlier(replaced: set[tuple[str, int, str, int]]) -> list[dict[str, Any]]:
    """The results file's runs of the (cell, seed) pairs this invocation does not run (``--merge``)."""
    if not RESULTS.exists():
        return []
    runs: list[dict[str, Any]] = json.loads(RESULTS.read_text()).get("runs", [])
    return [r for r in runs if (r["setting"], r["workers"], r["mode"], r["seed"]) not in replaced]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODE_BY_KEY))
    parser.add_argument("--settings", default=",".join(settings()))
    parser.add_argument("--workers", default="2,8")
    parser.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 3,7")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--merge", action="store_true", help="keep the results file's runs of other cells and seeds")
    parser.add_argument("--no_write", action="store_true", help="print only")
    parser.add_argument("--report", action="store_true", help="run nothing: the doc and plot from the results file")
    args = parser.parse_args(argv)
    known = settings()
    for name in args.settings.split(","):  # lr<rate>: another learning rate, e.g. lr0.1
        if name.startswith("lr") and name[2:].replace(".", "", 1).isdigit():
            known[name] = float(name[2:])
    try:
        seeds = _seeds(args.seeds)
        modes = [MODE_BY_KEY[k] for k in args.modes.split(",")]
        chosen = [s for s in args.settings.split(",") if s in known]
        workers = [int(w) for w in args.workers.split(",")]
    except (KeyError, ValueError) as err:
        parser.error(f"--modes {list(MODE_BY_KEY)}, --settings {list(known)}, --workers {list(WORKERS)}, --seeds: {err}")
    if len(chosen) != len(args.settings.split(",")) or any(w not in WORKERS for w in workers) or args.epochs < 2:
        parser.error(f"--settings among {list(known)}, --workers among {list(WORKERS)}, --epochs >= 2")
    if args.report:
        doc = {**json.loads(RESULTS.read_text())}
        doc["summary"] = aggregate(doc["runs"])
        write_region(DOC, REGION, table(doc))
        plot(doc)
        print(table(doc))
        return 0
    os.chdir(ROOT)
    from elasticps.api.parsing import load_job_file
    from elasticps.data.readers import count_records

    document = yaml.safe_load(JOB.read_text())
    records, _ = count_records(load_job_file(JOB).spec.data)
    cells = [(s, w, m) for s in chosen for w in workers for m in modes]
    earlier = _earlier({(s, w, m.key, seed) for s, w, m in cells for seed in seeds}) if args.merge else []
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    total = len(cells) * len(seeds)

    def document_so_far() -> dict[str, Any]:
        every = [*earlier, *runs]
        return {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "runtime_s": round(time.monotonic() - started, 1),
            "epochs": args.epochs,
            "seeds": args.seeds,
            "settings": known,
            "complete": len(runs) == total,
            "summary": aggregate(every),
            "runs": every,
        }

    with tempfile.TemporaryDirectory(prefix="elasticps-async-") as tmp:
        for index, seed in enumerate(seeds):
            for setting, count, mode in cells_in_order(index, cells):
                work = Path(tmp) / f"{seed}-{setting}-{count}-{mode.key}"
                work.mkdir()
                job = work / "job.yaml"
                job.write_text(yaml.safe_dump(derive(document, mode, known[setting], count, seed, records, args.epochs)))
                label = f"[{len(runs) + 1}/{total}] seed {seed}, {setting}, {count} workers, {mode.label}"
                base = {"seed": seed, "setting": setting, "workers": count, "mode": mode.key}
                try:
                    figures = run_figures(run_elasticps(job, work, args.epochs, keep_samples=True))
                except (RunFailed, IncompleteRun) as err:
                    print(f"{label}: FAILED: {err}", flush=True)
                    runs.append({**base, "failed": str(err)[-2000:]})
                    continue
                figures.pop("local_steps_curve", None)
                runs.append({**base, **figures})
                to98 = figures["time_to_98_s"]
                print(
                    f"{label}: accuracy {figures['test_accuracy']:.4f}, 98% at "
                    f"{'-' if to98 is None else f'{to98:.1f} s'}, wall {figures['wall_s']:.1f} s, "
                    f"{figures['updates_per_s_epoch2'] or 0:.1f} updates/s",
                    flush=True,
                )
                if not args.no_write:
                    RESULTS.parent.mkdir(parents=True, exist_ok=True)
                    RESULTS.write_text(json.dumps(document_so_far(), indent=1))
    doc = document_so_far()
    print(table(doc))
    if not args.no_write:
        RESULTS.write_text(json.dumps(doc, indent=1))
        write_region(DOC, REGION, table(doc))
        plot(doc)
        print(f"wrote {RESULTS.relative_to(ROOT)}, the {REGION} region of docs/convergence.md, {PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
