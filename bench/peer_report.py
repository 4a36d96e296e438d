"""``bench.peer``'s results: medians per system, ratios to the peer, the issue's targets, the doc
section and the plot. Pure but for :func:`plot`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peer_jobs import ASYNC_LR, PEER, SYNC, SYSTEMS

METRICS = (
    "wall_s",
    "first_step_s",
    "examples_per_s_epoch2",
    "cpu_s_per_1000_examples",
    "cpu_s_per_1000_examples_epoch2",
    "test_accuracy",
)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per system (``run["system"]``) and metric: median, min, max over its runs."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for system in dict.fromkeys(run["system"] for run in runs):
        mine = [run for run in runs if run["system"] == system]
        out[system] = {
            metric: spread([float(run[metric]) for run in mine])
            for metric in METRICS
            if all(run.get(metric) is not None for run in mine)
        }
        out[system]["runs"] = {"median": len(mine), "min": len(mine), "max": len(mine)}
    return out


def ratio(summary: dict[str, Any], system: str, metric: str) -> float | None:
    """Median of ``system`` over the peer's median, None without both."""
    try:
        return float(summary[system][metric]["median"] / summary[PEER.key][metric]["median"])
    except (KeyError, ZeroDivisionError):
        return None


def verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets: async + staleness lr >= 1.2x the peer's examples/s in epoch 2, wall <= 0.85x
    the peer's, accuracy >= the peer's; sync >= 1.0x the peer's examples/s."""
    targets = [
        (ASYNC_LR.key, "examples_per_s_epoch2", ">=", 1.2, "examples/s in epoch 2"),
        (ASYNC_LR.key, "wall_s", "<=", 0.85, "wall time"),
        (ASYNC_LR.key, "test_accuracy", ">=", 1.0, "test accuracy"),
        (SYNC.key, "examples_per_s_epoch2", ">=", 1.0, "examples/s in epoch 2"),
    ]
    out = []
    for system, metric, op, target, what in targets:
        value = ratio(summary, system, metric)
        ok = value is not None and (value >= target if op == ">=" else value <= target)
        medians = [summary.get(k, {}).get(metric, {}).get("median") for k in (system, PEER.key)]
        out.append(
            {"system": system, "metric": metric, "what": what, "op": op, "target": target, "ratio": value, "pass": ok,
             "median": medians[0], "peer_median": medians[1]}
        )
    return out


def _label(key: str) -> str:
    return next(s.label for s in SYSTEMS if s.key == key)


def verdict_line(v: dict[str, Any]) -> str:
    value = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
    if v["metric"] == "test_accuracy" and v["ratio"] is not None:
        value = f"{v['median']:.4f} vs {v['peer_median']:.4f}"
    target = "the peer's" if v["metric"] == "test_accuracy" else f"{v['target']}x the peer's"
    return f"{_label(v['system'])}: {v['what']} {v['op']} {target}: {'PASS' if v['pass'] else 'MISS'} ({value})"


def _cell(summary: dict[str, Any], system: str, metric: str, fmt: str) -> str:
    s = summary.get(system, {}).get(metric)
    if s is None:
        return "-"
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def _ratio_cell(summary: dict[str, Any], system: str, metric: str) -> str:
    value = ratio(summary, system, metric)
    return "-" if value is None else f"{value:.2f}"


def table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| system | wall s | vs peer | examples/s epoch 2 | vs peer | first step s | CPU s / 1,000 examples | "
        "CPU s / 1,000 examples, epoch 2 | test accuracy | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        if system.key not in summary:
            continue
        k = system.key
        lines.append(
            f"| {system.label} | {_cell(summary, k, 'wall_s', '.1f')} | {_ratio_cell(summary, k, 'wall_s')} | "
            f"{_cell(summary, k, 'examples_per_s_epoch2', ',.0f')} | {_ratio_cell(summary, k, 'examples_per_s_epoch2')} | "
            f"{_cell(summary, k, 'first_step_s', '.1f')} | {_cell(summary, k, 'cpu_s_per_1000_examples', '.2f')} | "
            f"{_cell(summary, k, 'cpu_s_per_1000_examples_epoch2', '.2f')} | "
            f"{_cell(summary, k, 'test_accuracy', '.4f')} | {summary[k]['runs']['median']} |"
        )
    return lines


def console_lines(summary: dict[str, Any]) -> list[str]:
    lines = [f"{'system':<38} {'wall s':>7} {'ex/s ep2':>9} {'1st step':>8} {'CPU/1k':>7} {'ep2 CPU/1k':>10} {'accuracy':>8}"]
    for system in SYSTEMS:
        m = summary.get(system.key)
        if m is None:
            continue

        def med(metric: str, fmt: str, m: dict[str, Any] = m) -> str:
            return format(m[metric]["median"], fmt) if metric in m else "-"

        lines.append(
            f"{system.label:<38} {med('wall_s', '7.1f')} {med('examples_per_s_epoch2', '9,.0f')} "
            f"{med('first_step_s', '8.1f')} {med('cpu_s_per_1000_examples', '7.2f')} "
            f"{med('cpu_s_per_1000_examples_epoch2', '10.2f')} {med('test_accuracy', '8.4f')}"
        )
    return lines + [verdict_line(v) for v in verdicts(summary)]


def markdown(doc: dict[str, Any], image: str, results: str) -> str:
    summary = doc["summary"]
    cfg = doc["settings"]
    peer_run: dict[str, Any] = next((r for r in doc["runs"] if r["system"] == PEER.key), {})
    out = [
        "## elasticps against TensorFlow's ParameterServerStrategy (issue 14)",
        "",
        f"Generated by `make bench-peer` (`bench/peer.py`, part of `make bench`) on {doc['date']} in "
        f"{doc['runtime_s']:.0f} s, {doc['repeats']} round(s); do not edit by hand, run it again. Every run is in "
        f"[`{results}`](../{results}).",
        "",
    ]
    if doc["repeats"] < 3:
        out += [f"**{doc['repeats']} round(s) only: the issue asks for the median of at least 3.**", ""]
    out += [
        f"One job for every system: `{cfg['model_def']}` on `{cfg['training']}` (test: `{cfg['validation']}`), "
        f"minibatch {cfg['minibatch']}, learning rate {cfg['learning_rate']} with the model's optimizer, "
        f"{cfg['num_epochs']} epochs, {cfg['ps']} PS + {cfg['workers']} workers, each a process on this machine. "
        "Median of the rounds, (min-max) in brackets; *vs peer* is the ratio of the medians.",
        "",
        *table(summary),
        "",
        "**Targets (issue 14, on a quiet machine):** " + "; ".join(verdict_line(v) for v in verdicts(summary)) + ".",
        "",
        f"![wall time and examples/s per system]({image})",
        "",
        "What each column is, measured alike for every system (`bench/peer_runs.py`):",
        "",
        "- **wall**: from the benchmark starting the system's command (`python -m bench.peer_tf` or "
        "`elasticps run`) to the test accuracy known. The peer: its own clock until it has the accuracy, shifted "
        "by its interpreter's start; elasticps: the first answer of PS 0's coordinator (`GetJobStatus`, polled "
        "every 50 ms) with `finished` (every task and the final evaluation done). The processes' shutdown after "
        "that is left out for both.",
        "- **first step**: from the same start to the first update applied on the PS. The peer: its first "
        "scheduled step returned; elasticps: the first coordinator answer with `model_version` >= 1. It is the "
        "start-up figure of issue 14 item 6 (`elasticps run` to first step), imports, process starts, data "
        "reading and compilation included.",
        "- **examples/s in epoch 2**: the peer: the epoch's steps x minibatch over the time from the end of "
        "epoch 1 (`coordinator.join()`) to the end of epoch 2; elasticps: the records done between the first "
        "coordinator answers past 1x and 2x the training set, over the time between those answers.",
        "- **CPU s / 1,000 examples**: user + system seconds of every process of the run (the command and every "
        "process it started: `getrusage(RUSAGE_CHILDREN)` around the wait; the peer reaps its TensorFlow "
        "servers, the local runner its PS and workers), start-up and evaluation included, per 1,000 training "
        "examples. *Epoch 2*: the CPU seconds of the same processes during epoch 2 only, read from "
        "`/proc/<pid>/stat` at the epoch's two ends (the peer: its servers and itself; elasticps: the runner and "
        "the replicas of its pid files), per 1,000 examples of the epoch: whether a system is short of CPU or "
        "waits.",
        "- **test accuracy**: the final model on the whole test set: the peer evaluates a local copy of the "
        "trained weights; elasticps's workers run the job's final evaluation.",
        "",
        "How the comparison is kept fair:",
        "",
        "- **Same job**: one TrainingJob YAML derived per system (`bench/peer_jobs.py`): same model module, "
        "records (read by elasticps's own readers in both), minibatch, optimizer (the module's, with the job's "
        "learning rate), epochs; evaluation only at the end for both (`evaluationSteps: 0`: no evaluation runs "
        "during epoch 2), no export and no checkpoints (the peer has neither).",
        f"- **Threads**: each worker computes its gradients with an intra-op pool of {peer_run.get('intra_op_threads', '?')} "
        "thread(s), the machine's CPUs over the 2 workers, in both systems: `elasticps run` gives each local worker "
        "that share (`--num_threads`, both pools; in a pod the worker sizes them to its CPU limit), and the peer's "
        "processes get the same intra-op size through `TF_NUM_INTRAOP_THREADS` (its inter-op pools keep "
        "TensorFlow's default: its servers run remote ops through them, and with 1 thread they deadlocked). The "
        "elasticps PS is numpy + gRPC without TensorFlow. Both systems run 3 processes besides their driver on the "
        "same cores.",
        f"- **Compilation**: both run their training step as a `tf.function`. The peer runs "
        f"{peer_run.get('steps_per_execution', 10)} steps per scheduled function, the `steps_per_execution` "
        "TensorFlow's parameter-server tutorial uses with `Model.fit` (Keras 3, which the models use, has no "
        "`fit` for this strategy, so `bench/peer_tf.py` runs the tutorial's custom loop with the same steps per "
        "call); elasticps workers call their step once per minibatch and exchange the model with the PS each time "
        "(`getModelFrequency: 1`).",
        "- **Interleaved**: each round runs every system once, the order rotated by one each round, so noise "
        "from the machine hits every system alike.",
        "",
        f"TensorFlow {peer_run.get('tensorflow', '?')}; machine: {doc['machine']['cpus_usable']} usable CPUs; load "
        f"average (1 min) {doc['load_average']['before'][0]:.1f} before, {doc['load_average']['after'][0]:.1f} after.",
    ]
    return "\n".join(out)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = doc["summary"]
    systems = [s for s in SYSTEMS if s.key in summary]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (metric, title) in zip(
        axes,
        (("wall_s", "wall time, s (lower is better)"), ("examples_per_s_epoch2", "examples/s in epoch 2"),
         ("first_step_s", "start to first step, s")),
    ):
        medians = [summary[s.key][metric]["median"] for s in systems]
        errors = [
            [m - summary[s.key][metric]["min"] for s, m in zip(systems, medians)],
            [summary[s.key][metric]["max"] - m for s, m in zip(systems, medians)],
        ]
        colors = ["tab:gray" if s.key == PEER.key else "tab:blue" for s in systems]
        ax.bar(range(len(systems)), medians, yerr=errors, color=colors, capsize=4)
        ax.set_xticks(range(len(systems)))
        ax.set_xticklabels([s.label.replace("elasticps ", "").replace("TensorFlow ", "TF ") for s in systems], rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"MNIST, 1 PS + 2 workers, {doc['settings']['num_epochs']} epochs: median (min-max) of {doc['repeats']} round(s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
