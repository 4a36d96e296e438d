"""``make bench-torch-peer``: elasticps with PyTorch workers against PyTorch DistributedDataParallel.

    python -m bench.torch_peer [--job examples/mnist-torch.yaml] [--repeats 2] [--epochs 2]

Four systems on one TrainingJob, 2 workers each, the same torch model, data, minibatch per worker,
optimizer, learning rate and epochs: DDP over gloo (``bench.ddp_mnist``: 2 processes, the ranks'
gradients averaged every step), seed 001's all-reduce SSGD over gloo (``bench.ddp_mnist
--allreduce``: the same ranks without DDP, one ``all_reduce`` per parameter's gradient), elasticps
sync (1 PS + 2 workers, every round averages one gradient per worker) and elasticps async (1 PS + 2
workers, ``bench.peer_jobs``' derivation). Each round runs every system once, in an order rotated
by one each round. The figures: examples per second in the last epoch, and the test accuracy at the
end.

Writes ``bench/results/torch_peer.json``, the ``torch-peer`` region of ``docs/benchmarks.md`` and
``docs/img/torch-peer.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from bench import doc_regions, peer_jobs
from bench.peer_runs import run_elasticps

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "torch_peer.json"
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "img" / "torch-peer.png"
REGION = "torch-peer"
DDP = "ddp"
ALLREDUCE = "allreduce"
SYSTEMS = (DDP, ALLREDUCE, peer_jobs.SYNC.key, peer_jobs.ASYNC.key)
LABELS = {
    DDP: "PyTorch DDP (gloo)",
    ALLREDUCE: "seed 001 all-reduce SSGD (gloo)",
    peer_jobs.SYNC.key: "elasticps torch sync",
    peer_jobs.ASYNC.key: "elasticps torch async",
}
TARGETS = {peer_jobs.SYNC.key: 0.8, peer_jobs.ASYNC.key: 1.0}  # examples/s against DDP's, at least


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ddp(job: Path, work: Path, allreduce: bool = False) -> dict[str, Any]:
    """The 2 ranks of ``bench.ddp_mnist`` (with ``--allreduce``: seed 001's SSGD), measured."""
    port, out = _free_port(), work / "ddp.json"
    flags = ["--allreduce"] if allreduce else []
    started = time.monotonic()
    logs = [(work / f"ddp-{r}.log").open("wb") for r in range(2)]
    try:
        ranks = [
            subprocess.Popen([sys.executable, "-m", "bench.ddp_mnist", str(job), "--rank", str(r), "--world", "2",
                              "--port", str(port), "--out", str(out), *flags], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=logs[r])  # fmt: skip
            for r in range(2)
        ]
        codes = [p.wait(timeout=1800) for p in ranks]
    finally:
        for log in logs:
            log.close()
    if any(codes):
        raise RuntimeError(f"DDP ranks exited {codes}: {(work / 'ddp-0.log').read_text()[-2000:]}")
    result = json.loads(out.read_text())
    return {**result, "wall_s": time.monotonic() - started, "examples_per_s_epoch2": result["examples_per_s_last_epoch"]}


def run_one(system: str, document: dict[str, Any], epochs: int, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    if system in (DDP, ALLREDUCE):
        derived = peer_jobs.derive(document, peer_jobs.SYNC, epochs)
        job = work / "job.yaml"
        job.write_text(yaml.safe_dump(derived))
        return run_ddp(job, work, allreduce=system == ALLREDUCE)
    derived = peer_jobs.derive(document, peer_jobs.BY_KEY[system], epochs)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(derived))
    result = run_elasticps(job, work, epochs)
    # The key holds the last epoch's rate (epoch 2 at the default --epochs), as the DDP ranks report.
    return {**result, "examples_per_s_epoch2": result["epochs"][-1]["examples_per_s"]}


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {
        s: {
            "examples_per_s_epoch2": statistics.median(r["examples_per_s_epoch2"] for r in rs),
            "test_accuracy": statistics.median(r["test_accuracy"] for r in rs),
            "wall_s": statistics.median(r["wall_s"] for r in rs),
        }
        for s, rs in runs.items()
        if rs
    }
    def ratios(base: str) -> dict[str, float]:
        rate = medians.get(base, {}).get("examples_per_s_epoch2")
        return {s: m["examples_per_s_epoch2"] / rate for s, m in medians.items() if rate and s != base}

    return {"medians": medians, "ratios_to_ddp": ratios(DDP), "ratios_to_allreduce": ratios(ALLREDUCE)}


def report(data: dict[str, Any]) -> str:
    med, to_ddp = data["summary"]["medians"], data["summary"]["ratios_to_ddp"]
    to_allreduce = data["summary"].get("ratios_to_allreduce", {})
    lines = [
        "## PyTorch workers against PyTorch DDP",
        "",
        f"`make bench-torch-peer` ({data['date']}): `{data['job']}`, 2 workers each, {data['epochs']} epochs, "
        f"{data['repeats']} rounds interleaved; elasticps with 1 PS; the all-reduce SSGD is DDP's ranks "
        "without the wrapper, one `all_reduce` per parameter's gradient (seed 001). Medians:",
        "",
        "| system | examples/s (last epoch) | vs DDP | vs all-reduce SSGD | test accuracy | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        if system not in med:
            continue
        m = med[system]
        vs_ddp = "1.00x" if system == DDP else f"{to_ddp[system]:.2f}x" if system in to_ddp else "-"
        if system in TARGETS and system in to_ddp:
            vs_ddp += f" (goal >= {TARGETS[system]}x)"
        vs_allreduce = "1.00x" if system == ALLREDUCE else f"{to_allreduce[system]:.2f}x" if system in to_allreduce else "-"
        lines.append(f"| {LABELS[system]} | {m['examples_per_s_epoch2']:,.0f} | {vs_ddp} | {vs_allreduce} "
                     f"| {m['test_accuracy']:.4f} | {m['wall_s']:.1f} |")  # fmt: skip
    loads = [r[k] for rs in data["runs"].values() for r in rs for k in ("load_1m_before", "load_1m_after") if k in r]
    if loads:
        lines += ["", f"1-minute load average at the runs' starts and ends: {min(loads):.1f} to {max(loads):.1f} "
                  f"({os.cpu_count()} CPUs; each run's own processes add about 2)."]  # fmt: skip
    lines += ["", "![examples/s against DDP](img/torch-peer.png)"]
    return "\n".join(lines)


def plot(data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, medians = data["runs"], data["summary"]["medians"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, system in enumerate(SYSTEMS):
        values = [r["examples_per_s_epoch2"] for r in runs.get(system, [])]
        ax.scatter([i] * len(values), values, color="C%d" % i)
        if values:
            ax.bar(i, statistics.median(values), color="C%d" % i, alpha=0.4)
    # The median under each name: a label on the bar would sit among the rounds' dots.
    names = [textwrap.fill(LABELS[s], 18) + (f"\nmedian {medians[s]['examples_per_s_epoch2']:,.0f}" if s in medians else "")
             for s in SYSTEMS]  # fmt: skip
    ax.set_xticks(range(len(SYSTEMS)), names)
    ax.set_ylabel("examples/s, last epoch")
    ax.set_title("PyTorch workers on elasticps vs DDP and all-reduce SSGD (2 workers, MNIST CNN)", fontsize=10)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "mnist-torch.yaml")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    document = yaml.safe_load(args.job.read_text())
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix="elasticps-torch-peer-") as tmp:
        for round_index in range(args.repeats):
            shift = round_index % len(SYSTEMS)
            for system in SYSTEMS[shift:] + SYSTEMS[:shift]:
                load_before = os.getloadavg()[0]
                run = run_one(system, document, args.epochs, Path(tmp) / f"{round_index}-{system}")
                # The machine's 1-minute load average around the run: other work on the cores shows here.
                run = {**run, "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0]}
                runs[system].append(run)
                print(f"[round {round_index + 1}/{args.repeats}] {LABELS[system]}: {run['examples_per_s_epoch2']:,.0f} "
                      f"examples/s (last epoch), accuracy {run['test_accuracy']:.4f}, {run['wall_s']:.1f} s, "
                      f"load {load_before:.1f} -> {run['load_1m_after']:.1f}", flush=True)  # fmt: skip
    data = {
        "date": datetime.date.today().isoformat(), "job": str(args.job.relative_to(ROOT) if args.job.is_relative_to(ROOT) else args.job),
        "epochs": args.epochs, "repeats": args.repeats, "runs": runs, "summary": summary(runs),
    }  # fmt: skip
    print(report(data))
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
        doc_regions.write_region(DOC, REGION, report(data))
        plot(data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
