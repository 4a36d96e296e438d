"""``make bench-identity``: what job identity costs the data path, measured in one run.

Per model size (1 and 16 MB of float32 parameters), four PS processes (``elasticps ps --use_async``),
two started with a job key and two without, and a worker's round trip against each (a push with
the pull right behind it, ``bench.run.PSCase``): over the bulk channel and over gRPC frames, with
the worker's token and without. The cases run interleaved, repetition by repetition, in rotating
order, so the machine's noise hits them alike; the figure is the median of each repetition's
paired ratio, identity on / off (above 1: identity costs that much time).

Writes ``bench/results/identity.json`` and ``docs/img/identity-cost.png``; prints the table that
``docs/architecture.md`` ("Job identity") quotes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.run import CHILD_ENV, CHUNK_BYTES, MB, Case, Child, PSCase, start_ps
from elasticps import identity

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "identity.json"
PLOT = ROOT / "docs" / "img" / "identity-cost.png"
SIZES_MB = (1, 16)
REPS = {1: 60, 16: 25}
QUICK_REPS = {1: 5, 16: 3}
WARMUP = 3
CASES = ("bulk", "frames")


def measure(size_mb: int, reps: int, workdir: Path, data: Path) -> dict[str, Any]:
    key = identity.new_key()
    token = identity.token_for(key, "worker-0")
    servers: dict[str, Child] = {}
    clients: dict[str, PSCase] = {}
    try:
        for case in CASES:
            for on in (False, True):
                name = f"{case}/{'on' if on else 'off'}"
                servers[name] = start_ps(f"ps-{size_mb}mb-{case}-{name[-2:]}", workdir, data, CHUNK_BYTES,
                                         key if on else None)  # fmt: skip
        for name, server in servers.items():
            clients[name] = PSCase(server.wait_port(), size_mb, CHUNK_BYTES, name.startswith("bulk"),
                                   token if name.endswith("/on") else "")  # fmt: skip
        cases = [Case(name, clients[name].round_trip, servers[name].popen.pid) for name in servers]
        for _ in range(WARMUP):
            for case in cases:
                case.run()
        for rep in range(reps):
            for case in cases[rep % len(cases):] + cases[: rep % len(cases)]:
                case.timed()
            print(f"[{size_mb} MB] rep {rep + 1}/{reps}: " + ", ".join(
                f"{c.name} {2 * size_mb / c.samples_s[-1]:.0f} MB/s" for c in cases), flush=True)
        for client in clients.values():
            client.check()
    finally:
        for client in clients.values():
            client.close()
        for server in servers.values():
            server.stop()
    by_name = {c.name: c for c in cases}
    out: dict[str, Any] = {"size_mb": size_mb, "repetitions": reps, "cases": {}}
    for case in CASES:
        on, off = by_name[f"{case}/on"].samples_s, by_name[f"{case}/off"].samples_s
        paired = [a / b for a, b in zip(on, off)]
        out["cases"][case] = {
            "on_samples_s": on, "off_samples_s": off,
            "on_mbps_median": 2 * size_mb / float(np.median(on)), "off_mbps_median": 2 * size_mb / float(np.median(off)),
            "time_ratio_median": float(np.median(paired)),
            "time_ratio_q25": float(np.percentile(paired, 25)), "time_ratio_q75": float(np.percentile(paired, 75)),
        }  # fmt: skip
    return out


def plot(results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels, medians, low, high = [], [], [], []
    for result in results:
        for case in CASES:
            c = result["cases"][case]
            labels.append(f"{case}\n{result['size_mb']} MB")
            medians.append(c["time_ratio_median"])
            low.append(c["time_ratio_median"] - c["time_ratio_q25"])
            high.append(c["time_ratio_q75"] - c["time_ratio_median"])
    ax.bar(range(len(labels)), medians, yerr=[low, high], color="#4c72b0", capsize=4)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.03, color="#c44e52", linewidth=0.8, linestyle="--", label="the 3% budget")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("round trip time, identity on / off")
    ax.set_ylim(0.9, max(1.1, max(medians) + 0.05))
    ax.set_title("Job identity's cost on the data path (median, quartiles)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.identity_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (a smoke test, not a result)")
    parser.add_argument("--no_write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in CHILD_ENV.items()):
        os.environ.update(CHILD_ENV)  # the servers get them through bench.run's spawn either way
    workdir = Path(tempfile.mkdtemp(prefix="elasticps-identity-"))
    data = workdir / "tiny.npz"
    np.savez(data, x=np.zeros((10, 4), dtype=np.float32), y=np.zeros(10, dtype=np.int64))
    started = time.monotonic()
    results = [measure(size, (QUICK_REPS if args.quick else REPS)[size], workdir, data) for size in SIZES_MB]
    print("\n| model | channel | off MB/s | on MB/s | time on / off (median) |")
    print("|---|---|---|---|---|")
    for result in results:
        for case in CASES:
            c = result["cases"][case]
            print(f"| {result['size_mb']} MB | {case} | {c['off_mbps_median']:.0f} | {c['on_mbps_median']:.0f} "
                  f"| {c['time_ratio_median']:.3f} |")
    print(f"({time.monotonic() - started:.0f} s)")
    if not args.no_write:
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        RESULTS.write_text(json.dumps({"date": date, "results": results}, indent=1) + "\n")
        plot(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
