"""The table spec codec (issue 32): the kind travels with the spec; a message without one (an older
peer's) is an embedding table; an unknown or implicit kind is refused naming it."""

from __future__ import annotations

import pytest

from elasticps.api.embedding import EmbeddingError, TableSpec
from elasticps.api.table_kinds import TableKind
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc.embedding_wire import CODECS, spec_message, spec_of

SPEC = TableSpec("items", 8, "normal", 0.1, 7)


def test_every_kind_has_a_codec() -> None:
    assert set(CODECS) == set(TableKind)


def test_the_kind_round_trips() -> None:
    message = spec_message(SPEC)
    assert message.kind == "embedding"
    assert spec_of(pb.EmbeddingTable.FromString(message.SerializeToString())) == SPEC


def test_a_message_without_a_kind_is_an_embedding_table() -> None:
    old = pb.EmbeddingTable(name="items", dim=8, initializer="normal", scale=0.1, seed=7)  # as a peer before kinds sends it
    assert not old.kind
    assert spec_of(old) == SPEC and spec_of(old).kind is TableKind.EMBEDDING


def test_an_unknown_kind_is_refused_naming_it() -> None:
    message = spec_message(SPEC)
    message.kind = "frobnicated"
    with pytest.raises(EmbeddingError, match="EmbeddingTable 'items': table kind 'frobnicated' is unknown"):
        spec_of(message)


@pytest.mark.parametrize("kind", ["dense", "state"])
def test_an_implicit_kind_is_never_declared_on_the_wire(kind: str) -> None:
    message = spec_message(SPEC)
    message.kind = kind
    with pytest.raises(EmbeddingError, match=f"kind '{kind}' is implicit"):
        spec_of(message)
