"""``bench.heterogeneity``'s report: medians per (slowdown, mode), the issue's verdicts, the doc and plots.

Writes ``bench/results/heterogeneity.json`` (every run), the region ``heterogeneity`` of
``docs/heterogeneity.md`` (one table per slowdown) and ``docs/img/heterogeneity.png`` (test accuracy
over wall time, one panel per slowdown, the median run of each mode by time to 98%),
``docs/img/heterogeneity_staleness.png`` (the share of pushes per staleness bucket, every run of a
mode summed, one panel per slowdown) and ``docs/img/adaptive_k.png`` (adaptive LocalSGD's K over
wall time). ``python -m bench.heterogeneity_report`` writes the doc and plots again from the
results file.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import doc_regions

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "heterogeneity.json"
DOC = ROOT / "docs" / "heterogeneity.md"
PLOT = ROOT / "docs" / "img" / "heterogeneity.png"
K_PLOT = ROOT / "docs" / "img" / "adaptive_k.png"
STALENESS_PLOT = ROOT / "docs" / "img" / "heterogeneity_staleness.png"
REGION = "heterogeneity"
FIGURES = (
    "time_to_97_s", "time_to_98_s", "test_accuracy", "updates_per_s_epoch2", "tensor_bytes_epoch2",
    "stale_share", "staleness_p90", "training_to_98_s",
)
MIN_SPEEDUP = 2.0  # the issue: under the 4x straggler, the best mode reaches 98% at least 2x sooner than sync


def _median(values: Sequence[float | None]) -> float | None:
    """The median; a run that never got there (None) ranks after every run that did, and the
    median is None when the middle run never got there."""
    present = [v for v in values if v is not None]
    if not values or len(present) == len(values):
        return statistics.median(present) if present else None
    ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
    return ranked[(len(ranked) - 1) // 2]


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """slowdown -> mode -> {figure: median, "runs": n}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        if "failed" in run:
            continue
        out.setdefault(run["slowdown"], {}).setdefault(run["mode"], {"runs": 0, **{f: [] for f in FIGURES}})
        cell = out[run["slowdown"]][run["mode"]]
        cell["runs"] += 1
        for figure in FIGURES:
            cell[figure].append(run.get(figure))
    for modes in out.values():
        for cell in modes.values():
            for figure in FIGURES:
                cell[figure] = _median(cell[figure])
    return out


FIXED_K = ("localsgd2", "localsgd4", "localsgd8")


def _seconds(value: float | None) -> str:
    return "never" if value is None or value == float("inf") else f"{value:.1f} s"
ADAPTIVE = "localsgd-adaptive"


def adaptive_lines(doc: Mapping[str, Any]) -> list[str]:
    """Per slowdown: adaptive LocalSGD's median time to 98% against the spread (fastest to slowest
    run) of the fixed K with the best median; within it, or faster, is the issue's mark."""
    lines: list[str] = []
    for key, label in doc["slowdowns"].items():
        summary = doc["summary"].get(key, {})
        fixed = {k: summary[k]["time_to_98_s"] for k in FIXED_K if summary.get(k, {}).get("time_to_98_s") is not None}
        adaptive = summary.get(ADAPTIVE, {}).get("time_to_98_s")
        if not fixed:
            continue
        best = min(fixed, key=lambda k: fixed[k])
        spread = [r["time_to_98_s"] for r in doc["runs"] if r["slowdown"] == key and r["mode"] == best and "failed" not in r]
        ranked = sorted(float("inf") if t is None else t for t in spread)
        mark = "ok" if adaptive is not None and adaptive <= ranked[-1] else "MISSED"
        lines.append(
            f"{label}: adaptive LocalSGD reaches 98% in {_seconds(adaptive)}; the best fixed K, "
            f"{doc['modes'].get(best, best)}, in {fixed[best]:.1f} s (its runs {_seconds(ranked[0])} to "
            f"{_seconds(ranked[-1])}) ({mark}: within that spread or faster)"
        )
    return lines


MIN_BACKUP_RATE = 1.3  # issue 16: under random 6x, backup workers give 1.3x standard decentralized's iterations/s
MIN_SKIP_SPEEDUP = 1.5  # ... under the 4x straggler, skipping (max jump 10) reaches 97% 1.5x sooner
MAX_SKIP_SLOWDOWN = 1.5  # ... and the straggler slows the average iteration by at most 1.5x with skipping


def _figure(doc: Mapping[str, Any], slowdown: str, mode: str, figure: str) -> float | None:
    value = doc["summary"].get(slowdown, {}).get(mode, {}).get(figure)
    return None if value is None else float(value)


def hop_lines(doc: Mapping[str, Any]) -> list[str]:
    """Issue 16's figures for the decentralized modes, where their runs exist: iterations per second
    with a backup worker against the standard rule under the random 6x slowdown; under the 4x
    straggler, time to 97% with skipping (max jump 10) against the standard rule, and how much the
    straggler slows the average iteration (the job's iterations per second without a slowdown over
    those with it) with and without skipping."""
    lines: list[str] = []
    standard, backup = (_figure(doc, "random6", m, "updates_per_s_epoch2") for m in ("hop", "hop-backup1"))
    if standard and backup:
        ratio = backup / standard
        mark = "ok" if ratio >= MIN_BACKUP_RATE else "MISSED"
        lines.append(f"random 6x: decentralized with 1 backup worker {backup:.2f} iterations/s, standard {standard:.2f}: "
                     f"{ratio:.2f}x ({mark}: at least {MIN_BACKUP_RATE}x)")
    slow, skip = (_figure(doc, "straggler4", m, "time_to_97_s") for m in ("hop", "hop-skip10"))
    if slow and skip:
        ratio = slow / skip
        mark = "ok" if ratio >= MIN_SKIP_SPEEDUP else "MISSED"
        lines.append(f"worker 0 4x slower: skipping (max jump 10) reaches 97% in {skip:.1f} s, standard decentralized in "
                     f"{slow:.1f} s: {ratio:.2f}x ({mark}: at least {MIN_SKIP_SPEEDUP}x)")
    for mode, label in (("hop", "standard"), ("hop-skip10", "skipping (max jump 10)")):
        calm, slowed = _figure(doc, "none", mode, "updates_per_s_epoch2"), _figure(doc, "straggler4", mode, "updates_per_s_epoch2")
        if calm and slowed:
            factor = calm / slowed
            mark = "" if mode == "hop" else f" ({'ok' if factor <= MAX_SKIP_SLOWDOWN else 'MISSED'}: at most {MAX_SKIP_SLOWDOWN}x)"
            lines.append(f"worker 0 4x slower: the average iteration of decentralized, {label}, takes {factor:.2f}x "
                         f"as long as without a slowdown ({calm:.2f} vs {slowed:.2f} iterations/s){mark}")
    return lines


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """The issue's figures: under the 4x straggler, the best mode's time to 98% against sync's, and
    adaptive LocalSGD against the best fixed K under each slowdown."""
    lines: list[str] = []
    straggler = doc["summary"].get("straggler4", {})
    sync = straggler.get("sync", {}).get("time_to_98_s")
    reached = {m: c["time_to_98_s"] for m, c in straggler.items() if c.get("time_to_98_s") is not None}
    if sync is not None and reached:
        best = min(reached, key=lambda m: reached[m])
        speedup = sync / reached[best]
        mark = "ok" if speedup >= MIN_SPEEDUP else "MISSED"
        training = {m: straggler[m].get("training_to_98_s") for m in (best, "sync")}
        after_start = (
            f"; from the first training step {training[best]:.1f} s and {training['sync']:.1f} s: "
            f"{training['sync'] / training[best]:.2f}x"
            if None not in training.values() and training[best]
            else ""
        )
        lines.append(
            f"worker 0 4x slower: {doc['modes'].get(best, best)} reaches 98% in {reached[best]:.1f} s, sync in "
            f"{sync:.1f} s: {speedup:.2f}x ({mark}: at least {MIN_SPEEDUP:.0f}x){after_start}"
        )
    return lines + adaptive_lines(doc) + hop_lines(doc)


def run_line(figures: Mapping[str, Any]) -> str:
    moved = figures.get("tensor_bytes_epoch2")
    rate = figures.get("updates_per_s_epoch2")
    stale = figures.get("stale_share")
    return (
        f"97% {_seconds(figures['time_to_97_s'])}, 98% {_seconds(figures['time_to_98_s'])}, "
        f"accuracy {figures['test_accuracy']:.4f}, {'-' if rate is None else f'{rate:.1f}'} updates/s, "
        f"epoch 2 {'-' if moved is None else f'{moved / 1e6:,.0f}'} MB, wall {figures['wall_s']:.1f} s, "
        f"stale pushes {'-' if stale is None else f'{100 * stale:.0f}%'} (p90 {figures.get('staleness_p90')})"
    )


def _merged(doc: Mapping[str, Any]) -> str:
    kept = int(doc.get("merged_runs", 0))
    return f" ({kept} of the runs kept from an earlier sitting, `--merge`)" if kept else ""


def table(doc: Mapping[str, Any]) -> str:
    def cell(value: float | None, form: str) -> str:
        return "never" if value is None else format(value, form)

    def figure(value: float | None, form: str, unit: str = "") -> str:  # none for the mode (no PS: no bytes)
        return "-" if value is None else format(value, form) + unit

    parts = [
        f"Generated by `make bench-heterogeneity` (`bench/heterogeneity.py`) on {doc['date']} in "
        f"{doc['runtime_s']:.0f} s: {doc['workers']} workers, {doc['ps']} PS, {doc['epochs']} epochs, "
        f"medians of {doc['repeats']} interleaved repetitions{_merged(doc)}; every run in "
        "[`bench/results/heterogeneity.json`](../bench/results/heterogeneity.json). Do not edit by hand.",
        "",
        *(f"- {line}" for line in verdict_lines(doc)),
    ]
    for key, label in doc["slowdowns"].items():
        parts += [
            "",
            f"**{label}**",
            "",
            "| mode | to 97% (s) | to 98% (s) | to 98% from the first step (s) | final accuracy "
            "| updates/s (epoch 2; decentralized: iterations/s) | tensor MB (epoch 2) | stale pushes | staleness p90 | runs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for mode, mode_label in doc["modes"].items():
            c = doc["summary"].get(key, {}).get(mode)
            if c is None:
                tried = any(r["slowdown"] == key and r["mode"] == mode for r in doc["runs"])
                parts.append(f"| {mode_label} | {'failed' if tried else 'not run'} | | | | | | | | 0 |")
                continue
            moved = c["tensor_bytes_epoch2"]
            parts.append(
                f"| {mode_label} | {cell(c['time_to_97_s'], '.1f')} | {cell(c['time_to_98_s'], '.1f')} | "
                f"{cell(c['training_to_98_s'], '.1f')} | "
                f"{figure(c['test_accuracy'], '.4f')} | {figure(c['updates_per_s_epoch2'], '.1f')} | "
                f"{figure(None if moved is None else moved / 1e6, ',.0f')} | "
                f"{figure(None if c['stale_share'] is None else 100 * c['stale_share'], '.0f', '%')} | "
                f"{figure(c['staleness_p90'], '.0f')} | {c['runs']} |"
            )
    parts += [
        "",
        "![accuracy over wall time](img/heterogeneity.png)",
        "",
        "![staleness of pushes](img/heterogeneity_staleness.png)",
        "",
        "![adaptive K](img/adaptive_k.png)",
    ]
    return "\n".join(parts)


def _median_run(runs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    ranked = sorted(runs, key=lambda r: float("inf") if r.get("time_to_98_s") is None else r["time_to_98_s"])
    return ranked[(len(ranked) - 1) // 2]


def plot(doc: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in doc["runs"] if "failed" not in r]
    slowdowns = list(doc["slowdowns"].items())
    figure, axes = plt.subplots(1, len(slowdowns), figsize=(6 * len(slowdowns), 4.5), sharey=True, squeeze=False)
    # One colour per mode across the panels (tab20: more modes than tab10 has colours); the
    # decentralized modes dashed.
    colours = {mode: plt.get_cmap("tab20")(i % 20) for i, mode in enumerate(doc["modes"])}
    for axis, (key, label) in zip(axes[0], slowdowns):
        for mode, mode_label in doc["modes"].items():
            mine = [r for r in done if r["slowdown"] == key and r["mode"] == mode]
            if mine:
                points = _median_run(mine)["accuracy_curve"]
                style = "--" if mode.startswith(("hop", "allreduce")) else "-"
                axis.plot([t for t, _ in points], [a for _, a in points], label=mode_label, marker=".",
                          color=colours[mode], linestyle=style)
        axis.set_title(label)
        axis.set_xlabel("wall time (s)")
        axis.set_ylim(0.9, 1.0)
        axis.axhline(0.98, color="grey", linewidth=0.5)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    shown: dict[str, Any] = {}  # every mode in the legend, though a panel may lack some
    for axis in axes[0]:
        for handle, name in zip(*axis.get_legend_handles_labels()):
            shown.setdefault(name, handle)
    axes[0][-1].legend(list(shown.values()), list(shown), fontsize=7)
    figure.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=110)
    plt.close(figure)
    _plot_staleness(plt, doc, done)
    adaptive = [r for r in done if r["mode"] == "localsgd-adaptive"]
    figure, axis = plt.subplots(figsize=(7, 4))
    for run in adaptive:
        points = run["local_steps_curve"]
        axis.step([t for t, _ in points], [k for _, k in points], where="post", label=f"{run['slowdown']}, rep {run['repetition']}")
    axis.set_xlabel("wall time (s)")
    axis.set_ylabel("K (local steps per averaging)")
    axis.set_title("adaptive LocalSGD: K over time")
    axis.grid(alpha=0.3)
    if adaptive:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(K_PLOT, dpi=110)
    plt.close(figure)


def staleness_shares(runs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[float]]:
    """Bucket labels and the share of all pushes of ``runs`` (one mode, one slowdown) in each."""
    labels: list[str] = []
    counts: list[float] = []
    for run in runs:
        for i, (low, high, n) in enumerate(run["staleness"]):
            if i == len(counts):
                labels.append(str(low) if low == high else f"{low}+" if high is None else f"{low}-{high}")
                counts.append(0.0)
            counts[i] += n
    total = sum(counts)
    return labels, [c / total if total else 0.0 for c in counts]


def _plot_staleness(plt: Any, doc: Mapping[str, Any], done: Sequence[Mapping[str, Any]]) -> None:
    slowdowns = list(doc["slowdowns"].items())
    figure, axes = plt.subplots(1, len(slowdowns), figsize=(6 * len(slowdowns), 4), sharey=True, squeeze=False)
    for axis, (key, label) in zip(axes[0], slowdowns):
        for mode, mode_label in doc["modes"].items():
            mine = [r for r in done if r["slowdown"] == key and r["mode"] == mode and r.get("staleness")]
            if mine:
                buckets, shares = staleness_shares(mine)
                axis.plot(buckets, shares, label=mode_label, marker=".")
        axis.set_title(label)
        axis.set_xlabel("staleness (PS version - gradient's version)")
        axis.set_yscale("symlog", linthresh=0.01)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("share of pushes")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(STALENESS_PLOT, dpi=110)
    plt.close(figure)


def earlier_runs(modes: Sequence[Any], slowdowns: Sequence[Any], path: Path = RESULTS) -> dict[str, Any]:
    """The runs of ``path`` of the (slowdown, mode) pairs other than ``slowdowns`` x ``modes``
    (objects with ``key``), with the labels of their modes and slowdowns."""
    if not path.exists():
        return {"modes": {}, "slowdowns": {}, "runs": []}
    old = json.loads(path.read_text())
    running = {(s.key, m.key) for s in slowdowns for m in modes}
    kept = [r for r in old["runs"] if (r["slowdown"], r["mode"]) not in running]
    return {
        "modes": {k: v for k, v in old["modes"].items() if any(r["mode"] == k for r in kept)},
        "slowdowns": {k: v for k, v in old["slowdowns"].items() if any(r["slowdown"] == k for r in kept)},
        "runs": kept,
    }


def save(doc: Mapping[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")


def write(doc: Mapping[str, Any]) -> None:
    save(doc)
    doc_regions.write_region(DOC, REGION, table(doc))
    plot(doc)


def main() -> int:
    """``python -m bench.heterogeneity_report``: the doc region and plots again from the results
    file (after a run cut short, whose file holds every run it finished)."""
    if not RESULTS.exists():
        print(f"bench.heterogeneity_report: no {RESULTS.relative_to(ROOT)}: run make bench-heterogeneity first")
        return 2
    doc = json.loads(RESULTS.read_text())
    doc_regions.write_region(DOC, REGION, table(doc))
    plot(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
