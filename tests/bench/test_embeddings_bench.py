"""bench.embeddings on a few minibatches against 2 real PS processes: its minibatches are distinct
sorted ids of the 10-million space, and the shards hold exactly the ids it pulled (the run checks
that itself and raises otherwise)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.embeddings import IDS, floor_minibatches, minibatches, run_ceiling, run_floor, run_ps, run_tables, wire_bound


def test_minibatches_are_distinct_sorted_ids_with_a_hot_head() -> None:
    batches = minibatches(20)
    for ids in batches:
        assert ids.dtype == np.int64 and 0 < ids.size < IDS
        assert np.all(np.diff(ids) > 0)
    counts = np.unique(np.concatenate(batches), return_counts=True)[1]
    assert counts.max() == 20  # the hottest ids are in every minibatch (Zipf)


@pytest.mark.slow
@pytest.mark.parametrize("behind", [True, False])
def test_two_ps_processes_hold_exactly_the_rows_pulled(tmp_path: Path, behind: bool) -> None:
    batches = minibatches(3)
    result = run_ps(4, batches, tmp_path, behind=behind)  # the next minibatch's rows behind each push, or apart
    assert result["rows_held"] == np.unique(np.concatenate(batches)).size
    assert result["rows_per_s"] > 0 and result["table_bytes"] > 0
    assert run_ceiling(4, batches)["rows_per_s"] > 0


def test_the_tables_alone_hold_exactly_the_rows_pulled() -> None:
    batches = minibatches(3)
    result = run_tables(4, batches)
    assert result["rows_held"] == np.unique(np.concatenate(batches)).size and result["rows_per_s"] > 0


@pytest.mark.slow
def test_the_wire_floor_moves_two_rows_a_minibatch_one_on_each_shard(tmp_path: Path) -> None:
    assert [np.mod(ids, 2).tolist() for ids in floor_minibatches(3)] == [[0, 1]] * 3
    floor = run_floor(4, 5, tmp_path)
    assert floor["rows_held"] == 10 and floor["distinct_ids_per_minibatch"] == 2
    # a minibatch of 2,000 rows, once per round trip: 1,000 times the floor's own rate
    assert wire_bound(floor, 2000) == pytest.approx(1000 * floor["rows_per_s"])
