"""What a row policy costs in AUC and saves in rows (issue 38): ``examples/criteo-deepfm.yaml``
with and without ``spec.training.embeddingPolicy``, seed by seed.

    python -m bench.row_policy [--policy admitAfter=2,ttl=8] [--seeds 1-5] [--no_write]

Each seed runs the example twice through ``elasticps run`` (2 PS, 2 workers, sync), interleaved:
as it is (every id keeps a row) and with the policy. Only ``spec.training.seed`` and the policy
change; the data path is the example's, resolved from the repository's root. Per run: the test AUC and
accuracy at the end, and the rows the shards hold, made and evicted (the job's result file,
``shard_embedding_rows*``). Reported: each run, and the medians and the median per-seed AUC
difference. Writes ``bench/results/row_policy.json`` and the ``row-policy`` region of
``docs/embeddings.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.doc_regions import write_region

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "criteo-deepfm.yaml"
RESULTS = ROOT / "bench" / "results" / "row_policy.json"
DOC = ROOT / "docs" / "embeddings.md"
POLICY = "admitAfter=2,ttl=8"


def job(seed: int, policy: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    data = document["spec"]["data"]
    for key in ("training", "validation"):  # relative to the repository, where `elasticps run` runs it
        path, _, cut = data[key].partition("[")
        data[key] = str((ROOT / path).resolve()) + (f"[{cut}" if cut else "")
    training = document["spec"]["training"]
    training["seed"] = seed
    if policy:
        training["embeddingPolicy"] = policy
    return document


def run(seed: int, policy: str, work: Path) -> dict[str, Any]:
    spec = work / f"job-{seed}-{'policy' if policy else 'off'}.yaml"
    spec.write_text(yaml.safe_dump(job(seed, policy)))
    result = spec.with_suffix(".json")
    done = subprocess.run([sys.executable, "-m", "elasticps", "run", str(spec), "--result_file", str(result)],
                          cwd=work, capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"seed {seed}, policy {policy!r}: the job failed: {done.stderr[-2000:]}")
    found = json.loads(result.read_text())
    return {"seed": seed, "policy": policy, "auc": found["metrics"]["auc"], "accuracy": found["metrics"]["accuracy"],
            "rows": sum(found["shard_embedding_rows"]), "made": sum(found["shard_embedding_rows_made"]),
            "evicted": sum(found["shard_embedding_rows_evicted"]), "seconds": found["elapsed_s"]}  # fmt: skip


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def summary(runs: list[dict[str, Any]], policy: str) -> list[str]:
    by = {(r["seed"], r["policy"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        "| seed | AUC, every row | AUC, with the policy | difference | rows held, every row | rows held, with the policy "
        "| made | evicted |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed in seeds:
        off, on = by[(seed, "")], by[(seed, policy)]
        lines.append(f"| {seed} | {off['auc']:.4f} | {on['auc']:.4f} | {on['auc'] - off['auc']:+.4f} | {off['rows']:,} | "
                     f"{on['rows']:,} | {on['made']:,} | {on['evicted']:,} |")  # fmt: skip
    median = statistics.median
    offs, ons = [by[(s, "")] for s in seeds], [by[(s, policy)] for s in seeds]
    lines.append(f"| median | {median(r['auc'] for r in offs):.4f} | {median(r['auc'] for r in ons):.4f} | "
                 f"{median(on['auc'] - off['auc'] for off, on in zip(offs, ons)):+.4f} | "
                 f"{median(r['rows'] for r in offs):,.0f} | {median(r['rows'] for r in ons):,.0f} | | |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=POLICY)
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="elasticps-row-policy-") as work:
        for seed in seeds_of(args.seeds):
            for policy in ("", args.policy) if seed % 2 else (args.policy, ""):  # interleaved, each first in turn
                found = run(seed, policy, Path(work))
                runs.append(found)
                print(f"seed {seed}, {policy or 'every row'}: AUC {found['auc']:.4f}, rows held {found['rows']:,} "
                      f"(made {found['made']:,}, evicted {found['evicted']:,}), {found['seconds']:.0f} s", flush=True)
    lines = summary(runs, args.policy)
    print("\n".join(lines))
    if args.no_write:
        return
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"when": when, "policy": args.policy, "runs": runs}, indent=1) + "\n")
    text = [
        f"Written by `python -m bench.row_policy` on {when}: `examples/criteo-deepfm.yaml` (2 PS, 2 workers, sync, "
        f"2 epochs of 8,000 records, AUC on the other 2,000) with `embeddingPolicy: {args.policy}` and without, "
        "each seed twice, interleaved (`bench/results/row_policy.json`). Rows: summed over both shards at the end; "
        "made and evicted: over the run.",
        "",
        *lines,
    ]
    write_region(DOC, "row-policy", "\n".join(text))


if __name__ == "__main__":
    main()
