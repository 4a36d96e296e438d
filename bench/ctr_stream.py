"""A CTR stream for the embedding scale benchmark (issue 38): Criteo's format, ids without end,
a click that can be learned. Pure numpy, written a chunk at a time.

    python -m bench.ctr_stream --records 9500000 --out /tmp/stream.txt [--new 0.5] [--seed 0]

Each record is a line of the ``criteo`` reader's format (label, 13 counts, 26 categorical 32-bit
hex values). Of the 26 categorical fields:

* the first :data:`HOT` are the signal: a value drawn Zipf-distributed (exponent 1.2) over
  :data:`HOT_VALUES` per field, each value with a fixed weight (normal, seeded); the click is drawn
  with probability ``sigmoid(bias + sum of the record's weights)``, so a model that learns those
  rows ranks the clicks (the true logit's AUC, :func:`true_auc`, is about 0.75);
* the others are the stream: each value is new (never written before in that field) with
  probability ``new``, else a Zipf draw over the field's values so far (hot ids recur, the tail
  is long). Distinct ids: about ``records * (26 - HOT) * new``, plus the hot ones
  (:func:`expected_ids`): 9.5 million records at ``new`` 0.5 give about 100 million.

The counts are small random integers (bucketed by the reader). Every value is a 32-bit number:
field ``f``'s ``k``-th new value is ``k * 0x9E3779B1 + f`` mod 2^32 scrambled, distinct per field
while ``k`` < 2^32.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FIELDS = 26
HOT = 4
HOT_VALUES = 1000
CHUNK = 50_000
BIAS = -1.5


def expected_ids(records: int, new: float) -> float:
    """The distinct categorical (field, value) pairs a stream of ``records`` about holds."""
    return records * (FIELDS - HOT) * new + HOT * HOT_VALUES


def _scramble(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """A bijection of the 32-bit numbers (odd multiplier, xor-shift), so values look hashed."""
    with np.errstate(over="ignore"):
        x = (x * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(15)
        return (x * np.uint64(0x297A2D39)) & np.uint64(0xFFFFFFFF)


@dataclass
class Stream:
    new: float
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._seen = np.zeros(FIELDS - HOT, np.int64)  # values written so far, per stream field
        self.weights = np.random.default_rng(self.seed + 1).normal(0.0, 0.8, (HOT, HOT_VALUES))

    def chunk(self, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
        """``count`` records: labels, categorical values (count, 26) and each record's true logit."""
        rng = self._rng
        hot = np.minimum(rng.zipf(1.2, (count, HOT)) - 1, HOT_VALUES - 1)
        logit = BIAS + self.weights[np.arange(HOT), hot].sum(axis=1)
        labels = (rng.random(count) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        values = np.empty((count, FIELDS), np.uint64)
        values[:, :HOT] = hot.astype(np.uint64) + (np.arange(HOT, dtype=np.uint64) << np.uint64(20))
        fresh = rng.random((count, FIELDS - HOT)) < self.new
        for f in range(FIELDS - HOT):  # a field's new values are numbered in record order
            order = np.cumsum(fresh[:, f]) - 1 + self._seen[f]
            seen_before = np.maximum(self._seen[f] + np.cumsum(fresh[:, f]) - fresh[:, f], 1)
            old = np.minimum(rng.zipf(1.1, count) - 1, seen_before - 1)  # recent ranks: the hot head is low k
            k = np.where(fresh[:, f], order, old).astype(np.uint64)
            values[:, HOT + f] = _scramble((k * np.uint64(0x9E3779B1) + np.uint64(f)) & np.uint64(0xFFFFFFFF))
            self._seen[f] += int(fresh[:, f].sum())
        return labels, values, logit

    def lines(self, records: int) -> Iterator[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
        """The stream as text, a chunk at a time, with the chunk's labels and true logits."""
        done = 0
        while done < records:
            count = min(CHUNK, records - done)
            labels, values, logit = self.chunk(count)
            counts = self._rng.integers(0, 50, (count, 13))
            cells = [labels.astype(str), *(counts[:, i].astype(str) for i in range(13)),
                     *(np.char.mod("%08x", values[:, i]) for i in range(FIELDS))]  # fmt: skip
            text = "\n".join("\t".join(row) for row in zip(*cells)) + "\n"
            done += count
            yield text, labels, logit


def true_auc(labels: npt.NDArray[np.int64], logit: npt.NDArray[np.float64]) -> float:
    """The AUC of the true click logit: the most a model can reach on this stream."""
    order = np.argsort(logit, kind="stable")
    ranks = np.empty(logit.size)
    ranks[order] = np.arange(1, logit.size + 1)
    positives = int(labels.sum())
    negatives = labels.size - positives
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def write(path: Path, records: int, new: float, seed: int = 0) -> float:
    """Writes ``records`` records to ``path``; the true logit's AUC over them."""
    stream = Stream(new, seed)
    labels, logits = [], []
    with path.open("w") as out:
        for text, chunk_labels, chunk_logit in stream.lines(records):
            out.write(text)
            labels.append(chunk_labels)
            logits.append(chunk_logit)
    return true_auc(np.concatenate(labels), np.concatenate(logits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--new", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.records < 1 or not 0.0 <= args.new <= 1.0:
        sys.exit("error: --records must be >= 1 and --new in [0, 1]")
    auc = write(args.out, args.records, args.new, args.seed)
    print(f"wrote {args.records:,} records to {args.out}: about {expected_ids(args.records, args.new):,.0f} distinct "
          f"categorical ids; the true logit's AUC {auc:.3f}")


if __name__ == "__main__":
    main()
