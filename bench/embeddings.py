"""Embedding tables on the PS (issue 17): pull + push of a minibatch's rows against 2 PS processes,
against the same gather and scatter in one process with numpy (the ceiling), and PS memory.

    python -m bench.embeddings [--minibatches 200] [--dims 16,64] [--no_write]

Each minibatch is 4,096 ids drawn Zipf-distributed (exponent 1.1) over 10 million ids, scrambled so
hot ids spread over the shards; a worker pulls and pushes each distinct id once. Per dim, a fresh
pair of ``elasticps ps`` processes (async, Adam) and the real ``PSClient`` over the shards' bulk
channels, twice: the next minibatch's rows pulled behind each push (``PushRequest.rows_behind``:
one round trip per minibatch, as a worker that knows its next ids does), and apart from it (a
pull of the distinct ids' rows from both shards at once, then the push of their gradients, a row
each), each minibatch's calls timed together. Reported: distinct rows moved per second (pulled
and pushed), MB/s of tensor bytes
(ids, rows, gradients), and the ratio to the ceiling: the same rows gathered from and scattered
(plain SGD) into one numpy array, positions known in advance (no lookup, no wire, no optimizer
state): what no PS can beat. Between the two, the shards' tables alone in this process (the same
pulls and pushes on two ``EmbeddingTable`` s, no wire, no client): what the PS's own work allows.
The wire's floor: the same 2 PS processes and client moving 2 rows a minibatch (one per shard),
rows behind each push: the round trip no row count shortens. The wire's bound is what that
allows at the real minibatch's rows (its distinct ids per round trip), against the ceiling: no
PS on this wire, however fast its tables, moves rows faster. Memory: the rows the shards hold (DescribeShard's
``embedding_rows``, which must equal the distinct ids pulled: the PS makes no other row), their
tables' bytes, and the PS processes' resident memory over their resident memory before the first
row, per million rows. Writes ``bench/results/embeddings.json`` and the section ``embeddings`` of
``docs/benchmarks.md``, with a plot (``docs/embeddings-bench.png``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.doc_regions import replace_region
from bench.ps_processes import PSProcesses
from elasticps.api.embedding import TableSpec, mix_ids
from elasticps.api.optimizer import OptimizerConfig
from elasticps.proto import elasticps_pb2 as pb
from elasticps.api.embedding import RowGrads
from elasticps.psclient.client import PSClient, PushRequest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "embeddings.json"
DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "embeddings-bench.png"
IDS, SPACE, ZIPF = 4096, 10_000_000, 1.1
ADAM = OptimizerConfig("adam", {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7})


def minibatches(count: int, seed: int = 0) -> list[np.ndarray]:
    """Each minibatch's distinct ids (sorted), Zipf over ``SPACE`` ids, scrambled."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ranks = (rng.zipf(ZIPF, IDS) - 1) % SPACE
        out.append(np.unique(mix_ids(np.uint64(7), ranks.astype(np.int64))))
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def describe(client: PSClient) -> list[pb.ShardState]:
    return [stub.DescribeShard(pb.DescribeRequest(), timeout=10) for stub in client._stubs]


def run_ps(dim: int, batches: list[np.ndarray], work: Path, behind: bool) -> dict[str, Any]:
    """Each minibatch's rows pulled, then its gradients pushed; ``behind``: the next minibatch's
    rows pulled behind the push (one round trip per minibatch), the first pulled alone."""
    train = work / "train.npz"
    np.savez(train, x=np.zeros((8, 1), np.float32), y=np.zeros(8, np.int64))
    processes = PSProcesses(2, work, train)
    client = PSClient(processes.addresses, worker="bench")
    try:
        table = TableSpec(f"bench{dim}", dim)
        client.declare_tables([table])
        client.push_model({"w": np.zeros(1, np.float32)}, ADAM)
        before = sum(rss_bytes(pid) for pid in processes.pids())
        zero = {"w": np.zeros(1, np.float32)}
        rng = np.random.default_rng(1)
        seconds, rows, moved, seen = [], 0, 0, set()
        grads = [rng.normal(0, 0.01, (ids.size, dim)).astype(np.float32) for ids in batches]
        pulled = client.pull_embeddings({table.name: batches[0]}).rows if behind else None
        for k, ids in enumerate(batches):
            began = time.perf_counter()
            if not behind:
                pulled = client.pull_embeddings({table.name: ids}).rows
            assert pulled is not None and pulled[table.name].shape == (ids.size, dim)
            following = {table.name: batches[k + 1]} if behind and k + 1 < len(batches) else None
            pushed = client.push(PushRequest(zero, [k] * client.num_shards, embeddings={table.name: RowGrads(ids, grads[k])},
                                             rows_behind=following)).result()  # fmt: skip
            seconds.append(time.perf_counter() - began)
            rows += ids.size
            moved += 2 * ids.nbytes + pulled[table.name].nbytes + grads[k].nbytes
            seen.update(ids.tolist())
            if following is not None:
                assert pushed.rows is not None
                pulled = pushed.rows.rows
        states = describe(client)
        after = sum(rss_bytes(pid) for pid in processes.pids())
        held = sum(s.embedding_rows for s in states)
        if held != len(seen):
            raise RuntimeError(f"the shards hold {held} rows for {len(seen)} distinct ids pulled")
        total = sum(seconds)
        return {"rows_per_s": rows / total, "mb_per_s": moved / total / 1e6, "ms_per_minibatch_p50": 1e3 * float(np.median(seconds)),
                "distinct_ids_per_minibatch": rows / len(batches), "rows_held": held,
                "table_bytes": sum(s.embedding_bytes for s in states),
                "table_bytes_per_million_rows": sum(s.embedding_bytes for s in states) / held * 1e6,
                "rss_growth_bytes": after - before, "rss_per_million_rows": (after - before) / held * 1e6}
    finally:
        client.close()
        processes.stop()


def floor_minibatches(count: int) -> list[np.ndarray]:
    """``count`` minibatches of 2 ids, one on each of 2 shards (ids go to shard ``id mod 2``)."""
    return [np.array([2 * k, 2 * k + 1], np.int64) for k in range(count)]


def run_floor(dim: int, count: int, work: Path) -> dict[str, Any]:
    """The wire's floor: :func:`run_ps` with rows behind each push, 2 rows a minibatch."""
    floor = run_ps(dim, floor_minibatches(count), work, behind=True)
    floor["seconds_per_minibatch"] = 2 / floor["rows_per_s"]
    return floor


def wire_bound(floor: dict[str, Any], distinct_per_minibatch: float) -> float:
    """Rows per second a PS whose per-row work cost nothing would move over this wire: the
    minibatch's distinct rows, once per round trip of the floor."""
    return distinct_per_minibatch / float(floor["seconds_per_minibatch"])


def run_tables(dim: int, batches: list[np.ndarray]) -> dict[str, Any]:
    """The shards' tables alone, in this process: each minibatch's rows pulled from and its
    gradients pushed to two ``EmbeddingTable`` s (Adam), ids split by shard as the client splits
    them; no wire, no client. What the PS's own work allows."""
    from elasticps.ps.embeddings import EmbeddingTable
    from elasticps.ps.optimizers import make_optimizer

    spec = TableSpec(f"alone{dim}", dim)
    tables = [EmbeddingTable(spec, make_optimizer(ADAM), shard=shard, shards=2) for shard in (0, 1)]
    rng = np.random.default_rng(1)
    grads = [rng.normal(0, 0.01, (ids.size, dim)).astype(np.float32) for ids in batches]
    began = time.perf_counter()
    for ids, g in zip(batches, grads):
        for shard, table in enumerate(tables):
            mine = np.mod(ids, 2) == shard
            table.pull(ids[mine])
            table.push(ids[mine], g[mine], 0.001)
    total = time.perf_counter() - began
    held, distinct = sum(table.rows_held for table in tables), np.unique(np.concatenate(batches)).size
    if held != distinct:
        raise RuntimeError(f"the tables hold {held} rows for {distinct} distinct ids pulled")
    return {"rows_per_s": sum(ids.size for ids in batches) / total, "rows_held": held}


def run_ceiling(dim: int, batches: list[np.ndarray]) -> dict[str, Any]:
    """Gather the rows and scatter their SGD update in one numpy array, positions precomputed."""
    every = np.unique(np.concatenate(batches))
    table = np.random.default_rng(0).uniform(-0.05, 0.05, (every.size, dim)).astype(np.float32)
    positions = [np.searchsorted(every, ids) for ids in batches]
    rng = np.random.default_rng(1)
    grads = [rng.normal(0, 0.01, (ids.size, dim)).astype(np.float32) for ids in batches]
    began = time.perf_counter()
    for at, g in zip(positions, grads):
        rows = table[at]
        table[at] = rows - np.float32(0.001) * g
    total = time.perf_counter() - began
    count = sum(ids.size for ids in batches)
    moved = sum(2 * ids.nbytes + 2 * ids.size * dim * 4 for ids in batches)
    return {"rows_per_s": count / total, "mb_per_s": moved / total / 1e6}


def write_doc(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = [row["dim"] for row in result["rows"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.35
    x = np.arange(len(dims))
    ax.bar(x - width / 2, [r["ps"]["rows_per_s"] / 1e6 for r in result["rows"]], width, label="2 PS (pull + push)")
    ax.bar(x + width / 2, [r["ceiling"]["rows_per_s"] / 1e6 for r in result["rows"]], width, label="numpy, one process")
    ax.set_xticks(x, [f"dim {d}" for d in dims])
    ax.set_ylabel("million rows / s")
    ax.set_yscale("log")
    ax.set_title(f"{IDS} Zipf ids over {SPACE:,} per minibatch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    lines = [
        "## Embedding tables: pull + push throughput and PS memory",
        "",
        f"Written by `python -m bench.embeddings` on {result['when']} ({result['minibatches']} minibatches per dim; "
        "part of `make bench`). What is measured and how: the module's docstring.",
        "",
        "![rows per second](embeddings-bench.png)",
        "",
        "| dim | rows/s, 2 PS | MB/s, 2 PS | ms per minibatch (p50) | rows/s, numpy ceiling | ratio to the ceiling | "
        "ratio, pulled apart from the push | ratio, the tables alone (no wire) | round trip of 2 rows (the wire's floor) | "
        "ratio, the wire's bound | rows held | table bytes per million rows | PS RSS growth per million rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ps, ceiling = r["ps"], r["ceiling"]
        lines.append(
            f"| {r['dim']} | {ps['rows_per_s']:,.0f} | {ps['mb_per_s']:.1f} | {ps['ms_per_minibatch_p50']:.2f} | "
            f"{ceiling['rows_per_s']:,.0f} | {ps['rows_per_s'] / ceiling['rows_per_s']:.3f} | "
            f"{r['ps_apart']['rows_per_s'] / ceiling['rows_per_s']:.3f} | "
            f"{r['tables']['rows_per_s'] / ceiling['rows_per_s']:.3f} | "
            f"{1e3 * r['floor']['seconds_per_minibatch']:.2f} ms | {r['wire_bound_rows_per_s'] / ceiling['rows_per_s']:.3f} | "
            f"{ps['rows_held']:,} | "
            f"{ps['table_bytes_per_million_rows'] / 1e6:,.0f} MB | {ps['rss_per_million_rows'] / 1e6:,.0f} MB |"
        )
    lines += [
        "",
        f"Distinct ids per minibatch: {result['rows'][0]['ps']['distinct_ids_per_minibatch']:,.0f} of {IDS}. "
        "Rows held equal the distinct ids pulled over the run (checked): of 10 million possible ids, the shards "
        "hold only those. Tables use Adam (two slots per row). The wire's bound: the minibatch's distinct rows "
        "once per round trip of 2 rows; no PS on this Python wire moves rows faster, however fast its tables.",
        "",
    ]
    DOC.write_text(replace_region(DOC.read_text(), "embeddings", "\n".join(lines)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatches", type=int, default=200)
    parser.add_argument("--dims", default="16,64")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args()
    batches = minibatches(args.minibatches)
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        with tempfile.TemporaryDirectory(prefix="elasticps-bench-emb-") as work:
            ps = run_ps(dim, batches, Path(work), behind=True)
        with tempfile.TemporaryDirectory(prefix="elasticps-bench-emb-") as work:
            apart = run_ps(dim, batches, Path(work), behind=False)
        with tempfile.TemporaryDirectory(prefix="elasticps-bench-emb-") as work:
            floor = run_floor(dim, args.minibatches, Path(work))
        tables = run_tables(dim, batches)
        ceiling = run_ceiling(dim, batches)
        bound = wire_bound(floor, ps["distinct_ids_per_minibatch"])
        rows.append({"dim": dim, "ps": ps, "ps_apart": apart, "tables": tables, "floor": floor,
                     "wire_bound_rows_per_s": bound, "ceiling": ceiling})
        print(f"dim {dim}: 2 PS {ps['rows_per_s']:,.0f} rows/s ({ps['mb_per_s']:.1f} MB/s, p50 "
              f"{ps['ms_per_minibatch_p50']:.2f} ms; pulled apart from the push {apart['rows_per_s']:,.0f}), numpy ceiling "
              f"{ceiling['rows_per_s']:,.0f} rows/s: ratio {ps['rows_per_s'] / ceiling['rows_per_s']:.3f} "
              f"({apart['rows_per_s'] / ceiling['rows_per_s']:.3f} apart; the tables alone "
              f"{tables['rows_per_s'] / ceiling['rows_per_s']:.3f}; the wire's bound {bound / ceiling['rows_per_s']:.3f}, "
              f"2 rows a round trip in {1e3 * floor['seconds_per_minibatch']:.2f} ms); rows held {ps['rows_held']:,}, "
              f"{ps['table_bytes_per_million_rows'] / 1e6:.0f} MB of tables and "
              f"{ps['rss_per_million_rows'] / 1e6:.0f} MB of PS RSS per million rows", flush=True)
    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "minibatches": args.minibatches, "ids_per_minibatch": IDS, "id_space": SPACE, "zipf": ZIPF, "rows": rows}
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        write_doc(result)


if __name__ == "__main__":
    main()
