"""LocalSGD K against sync on the MNIST example job: test accuracy and tensor bytes in epoch 2.

    python -m bench.local_sgd [--rounds 1] [--no_write]

Runs ``examples/mnist.yaml`` (sync) and ``examples/mnist-localsgd.yaml`` (LocalSGD K=4 after a warm-up
of 100 steps, which ends in epoch 1) one after the other, ``--rounds`` times, each through
``elasticps run`` measured as ``bench.peer_runs`` measures (the coordinator polled every 0.2 s; the
tensor bytes of an epoch are every shard's bytes received and sent between its two boundaries, from
the PS's own metric). Prints a line per run and the ratios of the issue's target: accuracy within
0.5 points of sync, at most 30% of sync's bytes in epoch 2. Writes ``bench/results/local_sgd.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.peer_runs import RunFailed, run_elasticps

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "local_sgd.json"
JOBS = {"sync": ROOT / "examples" / "mnist.yaml", "localsgd4": ROOT / "examples" / "mnist-localsgd.yaml"}
EPOCHS = 2
MAX_ACCURACY_GAP = 0.005
MAX_BYTES_RATIO = 0.30


def verdict(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per system and the two targets (pure: from the runs' figures)."""
    medians = {
        name: {
            "test_accuracy": statistics.median(r["test_accuracy"] for r in done),
            "tensor_bytes_epoch2": statistics.median(r["tensor_bytes_epoch2"] for r in done),
            "wall_s": statistics.median(r["wall_s"] for r in done),
        }
        for name, done in runs.items()
    }
    sync, local = medians["sync"], medians["localsgd4"]
    gap = sync["test_accuracy"] - local["test_accuracy"]
    ratio = local["tensor_bytes_epoch2"] / sync["tensor_bytes_epoch2"]
    return {
        "medians": medians,
        "accuracy_gap": gap,
        "bytes_ratio_epoch2": ratio,
        "accuracy_ok": gap <= MAX_ACCURACY_GAP,
        "bytes_ok": ratio <= MAX_BYTES_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in JOBS}
    with tempfile.TemporaryDirectory(prefix="elasticps-localsgd-") as tmp:
        for round_ in range(args.rounds):
            for name, job in JOBS.items():
                work = Path(tmp) / f"{name}-{round_}"
                work.mkdir()
                try:
                    figures = run_elasticps(job, work, EPOCHS)
                except RunFailed as err:
                    print(f"{name}: {err}")
                    return 1
                runs[name].append(figures)
                print(
                    f"round {round_ + 1} {name}: accuracy {figures['test_accuracy']:.4f}, "
                    f"epoch 2 tensor bytes {figures['tensor_bytes_epoch2'] / 2**20:,.0f} MiB, "
                    f"wall {figures['wall_s']:.1f} s",
                    flush=True,
                )
    result = verdict(runs)
    print(
        f"LocalSGD K=4 against sync: accuracy {result['medians']['localsgd4']['test_accuracy']:.4f} against "
        f"{result['medians']['sync']['test_accuracy']:.4f} ({'ok' if result['accuracy_ok'] else 'MISSED'}: "
        f"within {MAX_ACCURACY_GAP * 100:.1f} points); epoch 2 bytes {result['bytes_ratio_epoch2']:.3f} of sync's "
        f"({'ok' if result['bytes_ok'] else 'MISSED'}: at most {MAX_BYTES_RATIO:.2f})"
    )
    if not args.no_write:
        document = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **result, "runs": runs}
        RESULTS.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
