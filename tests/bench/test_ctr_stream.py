"""bench.ctr_stream: the criteo reader reads it, its ids grow as the size parameter says, and its
clicks follow the hot fields (the true logit ranks them well above chance)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.ctr_stream import FIELDS, HOT, HOT_VALUES, expected_ids, write
from elasticps.data.criteo import INTEGER_FIELDS, CriteoReader


def test_the_stream_reads_as_criteo_grows_its_ids_and_can_be_learned(tmp_path: Path) -> None:
    path = tmp_path / "stream.txt"
    auc = write(path, 20_000, new=0.5, seed=3)
    reader = CriteoReader(str(path))
    assert reader.num_records == 20_000
    x, y = reader.read(0, reader.num_records)
    assert x.shape == (20_000, INTEGER_FIELDS + FIELDS) and set(np.unique(y)) == {0, 1}
    categorical = np.unique(x[:, INTEGER_FIELDS:])
    tail = np.unique(x[:, INTEGER_FIELDS + HOT:])
    assert abs(tail.size - 20_000 * (FIELDS - HOT) * 0.5) < 0.05 * tail.size  # a new value half the time
    assert categorical.size <= expected_ids(20_000, 0.5) and categorical.size > tail.size
    assert np.unique(x[:, INTEGER_FIELDS:INTEGER_FIELDS + HOT]).size <= HOT * HOT_VALUES
    assert 0.68 < auc < 0.9, auc
    first, second = write(tmp_path / "a.txt", 1000, 0.5, seed=1), write(tmp_path / "b.txt", 1000, 0.5, seed=1)
    assert first == second and (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()  # seeded
