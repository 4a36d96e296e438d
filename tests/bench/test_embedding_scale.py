"""bench.embedding_scale on a small stream: the capped job holds at most its cap, evicts, samples
both PS's memory and reports the bound it is measured against."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ctr_stream import write
from bench.embedding_scale import HOLDOUT, TABLES, row_bound_bytes, run


@pytest.mark.slow
def test_a_small_capped_stream_stays_under_its_cap_and_is_measured(tmp_path: Path) -> None:
    data = tmp_path / "stream.txt"
    write(data, 6000 + HOLDOUT, 0.5)
    found = run(tmp_path, data, 6000, cap=5000)
    assert all(held <= TABLES * 5000 for held in found["rows_held"]), found["rows_held"]
    assert all(evicted > 0 for evicted in found["rows_evicted"])
    assert found["auc"] is not None and found["rss"] and len(found["bounds"]) == 2
    assert found["bounds"][0] == found["idle"][0] + row_bound_bytes(5000)
