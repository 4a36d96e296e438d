"""The apply rate of one PS shard against a single-process numpy ceiling doing the same arithmetic.

Per model size (1M and 25M float32 parameters in 4 variables), interleaved repetition by repetition:

* ``ceiling``: SGD over the model's arrays in one process, in plain numpy:
  ``np.multiply(g, lr, out=tmp)`` into a preallocated temporary, ``np.subtract(w, tmp, out=w)``;
* ``blocked``: the same a block of ``BLOCK_ELEMENTS`` at a time with a block-sized temporary (what
  the PS's optimizer does: the temporary stays in the cache), the ceiling that ratios are also given to;
* ``async``: ``ParameterStore.push`` of the same gradients to an async store (SGD): the push's checks
  (names, shapes, dtypes, one finiteness pass over the gradient), the finiteness proof, the update;
* ``sync``: one sync round of one worker, ``push`` + ``commit``: the gradient summed into the round's
  accumulator, averaged, checked and applied, the accumulator cleared.

Prints parameters/s per case and case / ceiling (median of the repetitions; per repetition ratios
paired). ``python -m bench.apply_rate [--sizes 1,25] [--reps 15] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.optimizers import BLOCK_ELEMENTS
from elasticps.ps.store import ParameterStore, StoreSettings

VARIABLES = 4
LEARNING_RATE = 0.01
GRADIENT = 1e-3
SGD = OptimizerConfig("sgd", {"learning_rate": LEARNING_RATE})


def _model(parameters: int) -> dict[str, np.ndarray]:
    each = parameters // VARIABLES
    return {f"layer{i}/kernel": np.full(each, 0.5, dtype=np.float32) for i in range(VARIABLES)}


def cases(parameters: int) -> dict[str, Callable[[], object]]:
    grads = {name: np.full_like(value, GRADIENT) for name, value in _model(parameters).items()}
    weights = _model(parameters)
    scratch = np.empty(parameters // VARIABLES, dtype=np.float32)
    lr = np.float32(LEARNING_RATE)

    def ceiling() -> None:
        for name, w in weights.items():
            np.multiply(grads[name], lr, out=scratch)
            np.subtract(w, scratch, out=w)

    block = np.empty(BLOCK_ELEMENTS, dtype=np.float32)
    blocked_weights = _model(parameters)

    def blocked() -> None:
        for name, w in blocked_weights.items():
            g = grads[name]
            for start in range(0, len(w), BLOCK_ELEMENTS):
                part = w[start : start + BLOCK_ELEMENTS]
                scaled = block[: len(part)]
                np.multiply(g[start : start + BLOCK_ELEMENTS], lr, out=scaled)
                np.subtract(part, scaled, out=part)

    async_store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.ASYNC)))
    async_store.initialize(_model(parameters), SGD)
    sync_store = ParameterStore(StoreSettings(mode=TrainingMode(rule=UpdateRule.SYNC)))
    sync_store.initialize(_model(parameters), SGD)

    def sync_round() -> None:
        version = sync_store.version
        sync_store.push(grads, version, worker="w")
        sync_store.commit(version, ["w"])

    return {
        "ceiling": ceiling,
        "blocked": blocked,
        "async": lambda: async_store.push(grads, async_store.version),
        "sync": sync_round,
    }


def measure(parameters: int, reps: int) -> dict[str, Any]:
    steps = cases(parameters)
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up: first touch, block buffers
        step()
    names = list(steps)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            steps[name]()
            samples[name].append(time.perf_counter() - t0)
    ceiling, best = samples["ceiling"], samples["blocked"]
    out: dict[str, Any] = {"parameters": parameters, "repetitions": reps, "cases": {}}
    for name, times in samples.items():
        median = float(np.median(times))
        out["cases"][name] = {
            "samples_s": times,
            "median_ms": median * 1e3,
            "parameters_per_s": parameters / median,
            "ratio_to_ceiling": float(np.median(ceiling)) / median,
            "paired_ratio_median": float(np.median([c / t for c, t in zip(ceiling, times)])),
            "ratio_to_blocked": float(np.median(best)) / median,
            "paired_blocked_ratio_median": float(np.median([c / t for c, t in zip(best, times)])),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apply_rate", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,25", help="model sizes in millions of parameters")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args(argv)
    results = [measure(int(float(s) * 1_000_000) // VARIABLES * VARIABLES, args.reps) for s in args.sizes.split(",")]
    print("parameters | case    | median ms | Mparams/s | / ceiling (medians, paired) | / blocked (medians, paired)")
    for result in results:
        for name, case in result["cases"].items():
            print(
                f"{result['parameters'] / 1e6:>9.1f}M | {name:<7} | {case['median_ms']:>9.2f} | "
                f"{case['parameters_per_s'] / 1e6:>9.0f} | {case['ratio_to_ceiling']:>12.2f}, "
                f"{case['paired_ratio_median']:.2f} | {case['ratio_to_blocked']:>12.2f}, "
                f"{case['paired_blocked_ratio_median']:.2f}"
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"benchmark": "apply_rate", "sizes": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
