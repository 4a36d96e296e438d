"""Table kinds in the spec (issue 32): a TableSpec is an embedding table unless it says otherwise,
and only a declarable kind can be named."""

from __future__ import annotations

import pytest

from elasticps.api.embedding import EmbeddingError, TableSpec, kind_of
from elasticps.api.table_kinds import DECLARED, IMPLICIT, TableKind


def test_a_spec_without_a_kind_is_an_embedding_table() -> None:
    assert TableSpec("items", 4).kind is TableKind.EMBEDDING
    assert TableSpec("items", 4, kind="embedding") == TableSpec("items", 4)  # type: ignore[arg-type]


def test_every_kind_is_implicit_or_declared() -> None:
    assert IMPLICIT | DECLARED == set(TableKind) and not IMPLICIT & DECLARED


@pytest.mark.parametrize("kind", sorted(IMPLICIT))
def test_an_implicit_kind_cannot_be_declared(kind: TableKind) -> None:
    with pytest.raises(EmbeddingError, match=f"kind .*{kind.value}.* cannot be declared"):
        TableSpec("items", 4, kind=kind)


def test_an_unknown_kind_is_refused_naming_it() -> None:
    with pytest.raises(EmbeddingError, match="table kind 'frobnicated' is unknown"):
        TableSpec("items", 4, kind="frobnicated")  # type: ignore[arg-type]
    assert kind_of("", "here") is TableKind.EMBEDDING
