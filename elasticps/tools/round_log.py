"""``python -m elasticps.tools.round_log DIR``: which minibatches the shards' models hold, read from
the shards' own round logs.

A sync PS started with ``ELASTICPS_ROUND_LOG=DIR`` appends to ``DIR/ps-<i>.jsonl`` a line for each
round it commits (the minibatches it averaged) and one for each restore from a checkpoint
(``restored``: the rounds from that version on left the model; ``ps/store.py``). :func:`in_model`
replays such a log: the rounds in the model at its end. A worker names each minibatch after its
epoch (``.../e<epoch>``, ``worker/steps.py``), so :func:`per_epoch` counts the minibatches applied
in each epoch, and :func:`twice` names those applied more than once. A job trains each record once
an epoch exactly when every epoch's count is :func:`expected_per_epoch` and nothing is applied twice.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def read(path: Path) -> list[dict[str, Any]]:
    """The log's lines; a last line cut short (a PS killed while writing it) is left out."""
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def in_model(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rounds still in the model after ``entries``, in order."""
    kept: list[dict[str, Any]] = []
    for entry in entries:
        if "restored" in entry:
            kept = [e for e in kept if e["round"] < entry["restored"]]
        else:
            kept.append(entry)
    return kept


def minibatches(entries: Sequence[dict[str, Any]]) -> list[str]:
    return [name for entry in in_model(entries) for name in entry["minibatches"]]


def epoch_of(minibatch: str) -> int:
    tail = minibatch.rsplit("/", 1)[-1]
    if not tail.startswith("e") or not tail[1:].isdigit():
        raise ValueError(f"minibatch {minibatch!r} names no epoch")
    return int(tail[1:])


def per_epoch(entries: Sequence[dict[str, Any]]) -> dict[int, int]:
    """Minibatches in the model, per epoch."""
    return dict(sorted(Counter(epoch_of(name) for name in minibatches(entries)).items()))


def twice(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Minibatches in the model more than once."""
    return sorted(name for name, n in Counter(minibatches(entries)).items() if n > 1)


def expected_per_epoch(num_records: int, records_per_task: int, minibatch_size: int) -> int:
    """The minibatches of one epoch: each task's records cut into minibatches (the last one shorter)."""
    full, rest = divmod(num_records, records_per_task)
    return full * math.ceil(records_per_task / minibatch_size) + math.ceil(rest / minibatch_size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elasticps.tools.round_log", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="the ELASTICPS_ROUND_LOG directory")
    args = parser.parse_args(argv)
    logs = sorted(args.directory.glob("ps-*.jsonl"))
    if not logs:
        print(f"no round logs (ps-<i>.jsonl) in {args.directory}", file=sys.stderr)
        return 1
    for path in logs:
        entries = read(path)
        restores = sum(1 for e in entries if "restored" in e)
        print(f"{path.stem}: {len(in_model(entries))} rounds in the model ({restores} restores), minibatches "
              f"per epoch {per_epoch(entries)}, applied twice: {len(twice(entries))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
