"""The PS client's table kinds (issue 32): every kind has a splitter in ``psclient/kinds.py``; the
embedding kind's cuts rows by ``id mod N`` and puts pulled rows back in the order asked."""

from __future__ import annotations

import numpy as np
import pytest

from elasticps.api.embedding import PART_GRADIENT, PART_IDS, RowGrads
from elasticps.api.table_kinds import DECLARED, IMPLICIT, TableKind
from elasticps.psclient.kinds import SPLITTERS, ById, Placed, by_id, placed
from elasticps.psclient.sharding import place, tensor_infos


def test_every_kind_has_a_splitter() -> None:
    assert set(SPLITTERS) == set(TableKind)
    for kind in IMPLICIT:
        assert isinstance(placed(kind), Placed)
    for kind in DECLARED:
        by_id(kind)


def test_a_kind_is_looked_up_only_as_what_it_is() -> None:
    with pytest.raises(ValueError, match="placed with the model"):
        by_id(TableKind.DENSE)
    with pytest.raises(ValueError, match="pulled by id"):
        placed(TableKind.EMBEDDING)


def test_rows_go_to_the_shard_of_their_id_and_come_back_in_order() -> None:
    splitter = ById()
    ids = np.array([6, 2, -4, 9, 11], np.int64)
    grads = np.arange(10, dtype=np.float32).reshape(5, 2)
    pieces = splitter.split(RowGrads(ids, grads), 3)
    assert pieces[0] is not None and pieces[1] is None and pieces[2] is not None  # 6, 9 | - | 2, -4, 11
    np.testing.assert_array_equal(pieces[0][PART_IDS], [6, 9])
    np.testing.assert_array_equal(pieces[2][PART_GRADIENT], grads[[1, 2, 4]])
    asked = splitter.ask(ids, 3)
    answers = [grads[np.isin(ids, mine)] if mine.size else None for mine in asked]  # a shard answers rows of its ids
    np.testing.assert_array_equal(splitter.join(ids, 3, answers), grads)


def test_the_dense_kind_cuts_by_the_placement() -> None:
    tensors = {"a": np.zeros((4, 2), np.float32), "b": np.zeros(3, np.float32)}
    placement = place(tensor_infos(tensors), 2, 0)
    assert placed(TableKind.DENSE).split(tensors, placement) == placement.split(tensors)
