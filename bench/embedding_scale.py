"""Embedding tables at scale (issue 38): a stream of new ids through a capped 2-PS async job, each
PS's memory over time against the cap's bound, and the AUC against the same job uncapped.

    python -m bench.embedding_scale [--records 9500000] [--cap 2000000] [--compare 200000] [--no_write]

The stream is ``bench/ctr_stream.py``'s (half of each record's 22 tail values new: about 11 new ids
per record, ``--records`` 9.5M give about 100M distinct ids), written to a temporary file with
20,000 more records held out for the AUC. The job: ``elasticps.backends.keras.zoo.deepfm`` (dim 8, one
hidden layer of 32), async, 2 PS and 2 workers, minibatch 512, one epoch, Adam, every table capped
at ``--cap`` rows a shard (``embeddingPolicy: maxRows=C``). Every second each PS's resident memory
is read from ``/proc``; the bound is what the cap allows: the PS's memory before its first row
(its first sample, once it serves) plus, per table, ``C`` rows of ``(1 + 2) * dim * 4`` bytes of values (Adam's two
slots) and 24 of id, count and last use, plus its index (16 bytes a slot, at most 4 slots a row
after doubling): the issue's "C x row bytes + its dense share + idle" (the dense share is a few KB).
Reported: the peak after the first minute against that bound, records/s and id lookups/s (39 per
record), the rows made and evicted, the AUC on the held-out records; and, on ``--compare``
records, the AUC with and without the cap (there every id fits). Writes
``bench/results/embedding_scale.json``, the ``embedding-scale`` region of ``docs/embeddings.md`` and
``docs/img/embedding-scale.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.ctr_stream import expected_ids, write
from bench.doc_regions import write_region

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "embedding_scale.json"
DOC = ROOT / "docs" / "embeddings.md"
PLOT = ROOT / "docs" / "img" / "embedding-scale.png"
HOLDOUT = 20_000
DIM = 8
TABLES = 2  # deepfm's linear (dim 1) and factors (dim DIM) tables
NAME = "scale"


def row_bound_bytes(cap: int) -> int:
    """What ``cap`` rows of each table may cost on a shard: values and slots, id, count and last use, index."""
    per_row = sum((1 + 2) * dim * 4 + 24 + 4 * 16 for dim in (1, DIM))
    return cap * per_row


def job(data: Path, records: int, cap: int) -> dict[str, Any]:
    training: dict[str, Any] = {"useAsync": True, "minibatchSize": 512, "numEpochs": 1, "recordsPerTask": 20_000,
                                "evaluationSteps": 0, "learningRate": 0.001}  # fmt: skip
    if cap:
        training["embeddingPolicy"] = f"maxRows={cap}"
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": NAME},
        "spec": {
            "model": {"modelDef": "elasticps.backends.keras.zoo.deepfm", "params": {"dim": DIM, "hidden": [32]}},
            "data": {"reader": "criteo", "training": f"{data}[0:{records}]",
                     "validation": f"{data}[{records}:{records + HOLDOUT}]"},  # fmt: skip
            "training": training,
            "ps": {"replicas": 2},
            "worker": {"replicas": 2},
            "runPolicy": {"backoffLimit": 3},
        },
    }


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(work: Path, data: Path, records: int, cap: int) -> dict[str, Any]:
    spec = work / f"job-{cap}.yaml"
    spec.write_text(yaml.safe_dump(job(data, records, cap)))
    run_dir, result_file = work / f"run-{cap}", work / f"result-{cap}.json"
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "elasticps", "run", str(spec), "--run_dir", str(run_dir),
                                "--result_file", str(result_file)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    samples: list[list[float]] = []  # [seconds, rss of PS 0, rss of PS 1]
    while process.poll() is None:
        pids = [run_dir / f"{NAME}-ps-{shard}.pid" for shard in (0, 1)]
        ready = [run_dir / f"ps-{shard}.port" for shard in (0, 1)]  # written once serving: its imports done
        if all(p.exists() for p in pids + ready):
            samples.append([time.monotonic() - began, *(rss(int(p.read_text())) for p in pids)])
        time.sleep(1.0)
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the job failed: {stderr[-3000:]}")
    found = json.loads(result_file.read_text())
    elapsed = float(found["elapsed_s"])
    out: dict[str, Any] = {"records": records, "cap": cap, "seconds": elapsed, "records_per_s": records / elapsed,
                           "lookups_per_s": 39 * records / elapsed, "auc": found["metrics"].get("auc"),
                           "rows_held": found["shard_embedding_rows"], "rows_made": found["shard_embedding_rows_made"],
                           "rows_evicted": found["shard_embedding_rows_evicted"], "rss": samples}  # fmt: skip
    if cap and samples:
        idle = [next((s[1 + shard] for s in samples if s[1 + shard] > 0), 0) for shard in (0, 1)]
        later = [s for s in samples if s[0] >= 60.0] or samples[len(samples) // 2:]
        peaks = [max(s[1 + shard] for s in later) for shard in (0, 1)]
        bounds = [idle[shard] + row_bound_bytes(cap) for shard in (0, 1)]
        out.update(idle=idle, peaks=peaks, bounds=bounds, ratios=[p / b for p, b in zip(peaks, bounds)])
    return out


def plot(capped: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    seconds = [s[0] for s in capped["rss"]]
    for shard in (0, 1):
        ax.plot(seconds, [s[1 + shard] / 2**20 for s in capped["rss"]], label=f"PS {shard} RSS")
        if "bounds" in capped:
            ax.axhline(1.2 * capped["bounds"][shard] / 2**20, linestyle="--", linewidth=0.8,
                       color=f"C{shard}", label=f"PS {shard}: 1.2 x the cap's bound")  # fmt: skip
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"{capped['records']:,} records, ~{expected_ids(capped['records'], 0.5) / 1e6:.0f}M ids, "
                 f"cap {capped['cap']:,} rows a table a shard")  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=9_500_000)
    parser.add_argument("--cap", type=int, default=2_000_000)
    parser.add_argument("--compare", type=int, default=200_000, help="records of the capped-or-not AUC comparison")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="elasticps-scale-") as folder:
        work = Path(folder)
        data = work / "stream.txt"
        print(f"writing {args.records + HOLDOUT:,} records ...", flush=True)
        write(data, args.records + HOLDOUT, 0.5)
        capped = run(work, data, args.records, args.cap)
        print(f"capped: {capped['records_per_s']:,.0f} records/s, {capped['lookups_per_s']:,.0f} lookups/s, AUC "
              f"{capped['auc']}, peaks {capped.get('peaks')} against bounds {capped.get('bounds')}", flush=True)
        small = work / "small.txt"
        write(small, args.compare + HOLDOUT, 0.5, seed=1)
        compared = [run(work, small, args.compare, cap) for cap in (0, max(16, args.compare // 4))]
        print(f"on {args.compare:,} records: AUC {compared[0]['auc']} uncapped, {compared[1]['auc']} capped at "
              f"{compared[1]['cap']:,}", flush=True)
    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "capped": capped, "compared": compared}  # fmt: skip
    if args.no_write:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    plot(capped)
    ratios = capped.get("ratios", [])
    lines = [
        f"Written by `python -m bench.embedding_scale --records {args.records} --cap {args.cap} --compare {args.compare}` "
        f"on {result['when']} (`bench/results/embedding_scale.json`).",
        "",
        "![PS memory over time](img/embedding-scale.png)",
        "",
        f"- {args.records:,} records, about {expected_ids(args.records, 0.5):,.0f} distinct ids, through 2 PS and 2 "
        f"workers (async) with `maxRows={args.cap}`: {capped['seconds']:.0f} s, {capped['records_per_s']:,.0f} "
        f"records/s, {capped['lookups_per_s']:,.0f} id lookups/s; rows made {sum(capped['rows_made']):,}, evicted "
        f"{sum(capped['rows_evicted']):,}, held at the end {capped['rows_held']}; AUC {capped['auc']:.4f}.",
        f"- Peak RSS after the first minute against the cap's bound (idle + C x row bytes): "
        + ", ".join(f"PS {i} {p / 2**20:,.0f} MiB / {b / 2**20:,.0f} MiB = {r:.2f}x"
                    for i, (p, b, r) in enumerate(zip(capped.get("peaks", []), capped.get("bounds", []), ratios))),
        f"- On {args.compare:,} records: AUC {compared[0]['auc']:.4f} with every row, {compared[1]['auc']:.4f} capped "
        f"at {compared[1]['cap']:,} rows (rows held {sum(compared[0]['rows_held']):,} and "
        f"{sum(compared[1]['rows_held']):,}).",
    ]
    write_region(DOC, "embedding-scale", "\n".join(lines))


if __name__ == "__main__":
    main()
