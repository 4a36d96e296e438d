"""``python -m bench.node_scaling``: PS updates per second of a sync MNIST TrainingJob on the real node,
scaled with ``kubectl scale`` while it trains, against jobs that keep one worker count from the start.

Scenarios, interleaved repetition by repetition so machine noise hits every one alike:

* ``scaled``: started at 2 workers, scaled to 4, then to 1, while it trains;
* ``fixed 4``, ``fixed 1`` and ``fixed 2``: started at that many workers and left alone.

Every job is the real-node tests' sync MNIST job (``tests/e2e_node/node_kit.mnist_job``: 1 PS,
minibatch 64, gradsToWait 0 = one gradient per live worker each round) with enough epochs that it
never ends on its own; it is deleted once its last phase is measured. A phase settles once exactly
that many worker pods run and ``status.liveWorkers`` (PS 0's coordinator) equals that count, plus
``--settle_s``; updates/s is then the slope of ``status.modelVersion`` over ``--window_s`` seconds,
between the first and the last change of it seen in the window (the operator is upgraded to
``--resync_seconds`` so the status follows the coordinator closely). Medians of ``--repeats``.

The cluster comes from the real-node tests' own fixtures (``tests/e2e_node/conftest.py``: build.sh,
the image (``ELASTICPS_REUSE_IMAGE=1`` keeps Docker's), ``cluster.py up --real-node``, load-image,
the operator's Helm release, MNIST on the node's disk), so this runs as one pytest session of those
fixtures and ends with ``cluster.py down`` as they do. Writes ``bench/results/node_scaling.json``
(after every run, so a cut-short session keeps what it measured) and the "Real node" section of
``docs/scaling.md`` (the other sections are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
KIT = REPO / "tests" / "e2e_node"
SCENARIOS: dict[str, tuple[int, ...]] = {"scaled": (2, 4, 1), "fixed 4": (4,), "fixed 1": (1,), "fixed 2": (2,)}
ARGS_ENV = "ELASTICPS_NODE_SCALING_ARGS"
SECTION = "## Real node"
POLL_S = 0.5


def _rate(points: list[tuple[float, int]], start: float, end: float) -> tuple[float, int]:
    """Updates/s between the first and the last change of the version seen in [start, end], and how
    many changes were seen (the status moves in steps, one per operator pass)."""
    inside = [(t, v) for t, v in points if start <= t <= end]
    changes = [inside[i] for i in range(1, len(inside)) if inside[i][1] != inside[i - 1][1]]
    if len(changes) < 2:
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0, len(changes)
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), len(changes)
    (t0, v0), (t1, v1) = changes[0], changes[-1]
    return (v1 - v0) / (t1 - t0), len(changes)


def measure(kubectl: Any, ns: str, data: Path, scenario: str, repetition: int, args: dict[str, Any]) -> dict[str, Any]:
    from node_kit import mnist_job, wait_for

    counts = SCENARIOS[scenario]
    name = f"{scenario.replace(' ', '')}-{repetition}"
    kubectl.apply(ns, mnist_job(name, data, workers=counts[0], epochs=args["epochs"], training={"gradsToWait": 0}))
    t_start = time.monotonic()
    points: list[tuple[float, int]] = []

    def sample() -> dict[str, Any]:
        status: dict[str, Any] = kubectl.job(ns, name).get("status", {})
        points.append((time.monotonic() - t_start, int(status.get("modelVersion") or 0)))
        return status

    def settled(count: int) -> bool:
        status = sample()
        pods = [p for p in kubectl.pods(ns, name)
                if p["metadata"]["labels"].get("elasticps.io/replica-type") == "worker" and not p["metadata"].get("deletionTimestamp")]
        return (status.get("liveWorkers") == count and len(pods) == count and points[-1][1] > 0
                and all(p["status"].get("phase") == "Running" for p in pods))

    phases = []
    load = [os.getloadavg()[0]]
    for index, count in enumerate(counts):
        asked = time.monotonic() - t_start
        if index:
            kubectl("scale", f"trainingjob/{name}", "-n", ns, f"--replicas={count}")
        wait_for(lambda count=count: settled(count), args["start_timeout_s"], f"{name}: {count} workers live", interval=POLL_S)
        ready = time.monotonic() - t_start
        start, end = ready + args["settle_s"], ready + args["settle_s"] + args["window_s"]
        while time.monotonic() - t_start < end + POLL_S:
            sample()
            time.sleep(POLL_S)
        rate, changes = _rate(points, start, end)
        phases.append({"workers": count, "asked_s": round(asked, 2), "settled_s": round(ready, 2),
                       "window": [round(start, 2), round(end, 2)], "updates_per_s": round(rate, 3), "changes": changes})
        print(f"node_scaling: {scenario} #{repetition} phase {index + 1} ({count} workers): {rate:.2f} updates/s "
              f"({changes} status changes in the window; live after {ready - asked:.1f} s)", file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    kubectl("delete", "trainingjob", name, "-n", ns, "--wait=false")
    wait_for(lambda: not kubectl.pods(ns, name), 180, f"{name}'s pods to be gone", interval=1)
    return {"scenario": scenario, "repetition": repetition, "phases": phases, "load_average": load,
            "samples": [(round(t, 2), v) for t, v in points]}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for scenario, counts in SCENARIOS.items():
        for index, workers in enumerate(counts):
            rates = [r["phases"][index]["updates_per_s"] for r in runs if r["scenario"] == scenario and len(r["phases"]) > index]
            if rates:
                rows.append({"scenario": scenario, "phase": index + 1, "workers": workers,
                             "median": statistics.median(rates), "rates": rates})
    fixed = {r["workers"]: r["median"] for r in rows if r["scenario"] != "scaled"}
    for r in rows:
        base = fixed.get(r["workers"]) if r["scenario"] == "scaled" else None
        r["ratio"] = round(r["median"] / base, 3) if base else None
    return rows


def section(rows: list[dict[str, Any]], runs: list[dict[str, Any]], args: dict[str, Any], elapsed_s: float) -> str:
    loads = [x for r in runs for x in r["load_average"]]
    done = min((sum(r["scenario"] == s for r in runs) for s in SCENARIOS), default=0)
    lines = [
        SECTION,
        "",
        f"Generated by `python -m bench.node_scaling --repeats {args['repeats']}` (`bench/node_scaling.py`) on "
        f"{time.strftime('%Y-%m-%d')} in {elapsed_s:.0f} s, {os.cpu_count()} CPUs ({platform.machine()}); do not edit "
        "by hand, run it again. Every sample is in "
        "[`bench/results/node_scaling.json`](../bench/results/node_scaling.json).",
        "",
        "TrainingJobs on the real node (`cluster.py up --real-node`; the pods run the project's image under "
        "containerd): mnist_cnn on MNIST (hostPath), sync, gradsToWait 0 (one gradient per live worker each "
        "round), 1 PS, minibatch 64. *scaled* starts at 2 workers and is scaled to 4, then to 1, with "
        "`kubectl scale trainingjob/NAME --replicas=N` while it trains; *fixed N* keeps N workers. A phase "
        "is measured once exactly that many worker pods run and `status.liveWorkers` equals it, plus "
        f"{args['settle_s']:g} s, over {args['window_s']:g} s: updates/s is the slope of `status.modelVersion` "
        f"(the operator resyncs every {args['resync_s']:g} s). Medians of {done} complete interleaved repetition(s) "
        f"(asked: {args['repeats']}); *ratio* is scaled / fixed at the same worker count (target 0.75-1.25). "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} at the starts and ends of the runs, on "
        f"{os.cpu_count()} CPUs, the cluster's own processes included.",
        "",
        "| scenario | phase | workers | median updates/s | each repetition | ratio scaled/fixed |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        each = ", ".join(f"{x:.2f}" for x in r["rates"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['scenario']} | {r['phase']} | {r['workers']} | {r['median']:.2f} | {each} | {ratio} |")
    return "\n".join(lines) + "\n"


def write(runs: list[dict[str, Any]], args: dict[str, Any], elapsed_s: float) -> str:
    rows = summarize(runs)
    results = REPO / "bench" / "results" / "node_scaling.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"settings": args, "summary": rows, "runs": runs}, indent=1))
    doc = REPO / "docs" / "scaling.md"
    text = doc.read_text() if doc.exists() else ""
    keep = text.split("\n" + SECTION, 1)[0].rstrip("\n")
    new = section(rows, runs, args, elapsed_s)
    doc.write_text((keep + "\n\n" if keep else "") + new)
    return new


@pytest.mark.timeout(3 * 3600)
def test_node_scaling(kubectl: Any, operator: str, ns: str, big_data: Path) -> None:
    """The benchmark, as one test of the real-node fixtures (run it through ``main``)."""
    args = json.loads(os.environ[ARGS_ENV])
    # The operator of the fixture, passing over each job every resync_s: the status follows the coordinator.
    done = subprocess.run(["helm", "upgrade", "elasticps", str(REPO / "helm" / "elasticps"), "-n", operator, "--reuse-values",
                           "--set", f"extraArgs={{--resync_seconds={args['resync_s']:g}}}", "--wait", "--timeout", "3m"],
                          env=kubectl.env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    for repetition in range(args["repeats"]):
        for scenario in SCENARIOS:
            if args["budget_s"] and time.monotonic() - started > args["budget_s"]:
                print(f"node_scaling: --budget_s {args['budget_s']} spent; stopping", file=sys.stderr)
                break
            runs.append(measure(kubectl, ns, big_data, scenario, repetition, args))
            write(runs, args, time.monotonic() - started)
    print("\n" + write(runs, args, time.monotonic() - started), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (the table shows medians)")
    parser.add_argument("--settle_s", type=float, default=5.0, help="seconds after the workers are live")
    parser.add_argument("--window_s", type=float, default=15.0, help="seconds of each measured window")
    parser.add_argument("--resync_s", type=float, default=1.0, help="the operator's --resync_seconds")
    parser.add_argument("--epochs", type=int, default=50, help="numEpochs of every job (it is deleted before)")
    parser.add_argument("--start_timeout_s", type=float, default=300.0, help="give up on a phase after this")
    parser.add_argument("--budget_s", type=float, default=0.0, help="start no run after this many seconds (0: none)")
    args = parser.parse_args(argv)
    os.environ[ARGS_ENV] = json.dumps(vars(args))
    sys.path.insert(0, str(KIT))  # node_kit, and the fixtures of conftest.py loaded as a plugin
    return int(pytest.main(["-q", "-s", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir", str(REPO),
                            "-o", "python_files=node_scaling.py", f"{Path(__file__).resolve()}::test_node_scaling"]))


if __name__ == "__main__":
    raise SystemExit(main())
