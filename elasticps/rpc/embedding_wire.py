"""Embedding tables on the wire (issue 17): table specs and id lists to and from their messages.

Used by the PS servicer (a PushModel's tables, a PullEmbeddings request) and by the PS client
(the same, the other way). Pure; refusals are :class:`~elasticps.api.embedding.EmbeddingError`
naming the field, which the servicer answers INVALID_ARGUMENT.

A spec message carries its table's kind (``EmbeddingTable.kind``; empty from a peer before kinds:
an embedding table), and :data:`CODECS` holds each kind's codec: a declared kind's turns its spec
into the message and back; the dense and state tables are implicit in every model, their tensors
travel in the frames (``TensorMeta``, ``TensorMeta.state``), so their entry refuses to be declared.
An unknown kind is refused naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from elasticps.api.embedding import EmbeddingError, IdArray, TableSpec, kind_of
from elasticps.api.table_kinds import TableKind
from elasticps.proto import elasticps_pb2 as pb

__all__ = ["CODECS", "MAX_PULL_IDS", "all_request", "ids_of", "ids_request", "spec_message", "spec_of"]
MAX_PULL_IDS = 1 << 20  # ids of one table in one PullEmbeddings request


class SpecCodec(Protocol):
    """One kind's table spec to its message and back."""

    def encode(self, spec: TableSpec) -> pb.EmbeddingTable: ...

    def decode(self, message: pb.EmbeddingTable, kind: TableKind) -> TableSpec: ...


class RowTableCodec:
    """A table of rows (the embedding kind): name, dim, initializer, scale and seed."""

    def encode(self, spec: TableSpec) -> pb.EmbeddingTable:
        return pb.EmbeddingTable(name=spec.name, dim=spec.dim, initializer=spec.initializer, scale=spec.scale,
                                 seed=spec.seed, kind=spec.kind.value)

    def decode(self, message: pb.EmbeddingTable, kind: TableKind) -> TableSpec:
        return TableSpec(message.name, int(message.dim), message.initializer, float(message.scale),
                         int(message.seed), kind)


class ImplicitCodec:
    """A table every model has (dense, state): its tensors ride in the frames, it is never declared."""

    def encode(self, spec: TableSpec) -> pb.EmbeddingTable:
        raise EmbeddingError(f"table {spec.name!r}: kind {spec.kind.value!r} is implicit in every model, not declared")

    def decode(self, message: pb.EmbeddingTable, kind: TableKind) -> TableSpec:
        raise EmbeddingError(f"EmbeddingTable {message.name!r}: kind {kind.value!r} is implicit in every model "
                             "and cannot be declared")


CODECS: Mapping[TableKind, SpecCodec] = {
    TableKind.DENSE: ImplicitCodec(),
    TableKind.STATE: ImplicitCodec(),
    TableKind.EMBEDDING: RowTableCodec(),
}


def spec_message(spec: TableSpec) -> pb.EmbeddingTable:
    return CODECS[spec.kind].encode(spec)


def spec_of(message: pb.EmbeddingTable) -> TableSpec:
    """The table a message declares (EmbeddingError says what is wrong with it, an unknown kind
    named)."""
    kind = kind_of(message.kind, f"EmbeddingTable {message.name!r}")
    return CODECS[kind].decode(message, kind)


ALL: IdArray = np.empty(0, np.int64)  # in a request's ids: every row the shard holds (EmbeddingIds.all)


def all_request(worker: str, tables: list[str]) -> pb.EmbeddingRequest:
    return pb.EmbeddingRequest(worker=worker, tables=[pb.EmbeddingIds(table=name, all=True) for name in tables])


def ids_request(worker: str, ids: Mapping[str, IdArray], read_only: bool = False) -> pb.EmbeddingRequest:
    tables = [pb.EmbeddingIds(table=name, ids=np.ascontiguousarray(values, "<i8").tobytes())
              for name, values in ids.items()]
    return pb.EmbeddingRequest(worker=worker, tables=tables, read_only=read_only)


def ids_of(request: pb.EmbeddingRequest) -> dict[str, IdArray | None]:
    """The ids a request asks for, per table (None: every row held): each table once, whole
    int64s, at most :data:`MAX_PULL_IDS` of them."""
    found: dict[str, IdArray | None] = {}
    for entry in request.tables:
        if entry.table in found:
            raise EmbeddingError(f"EmbeddingRequest.tables names table {entry.table!r} twice")
        if entry.all:
            if entry.ids:
                raise EmbeddingError(f"EmbeddingRequest.tables[{entry.table!r}] asks for all rows and for ids")
            found[entry.table] = None
            continue
        if len(entry.ids) % 8:
            raise EmbeddingError(f"EmbeddingRequest.tables[{entry.table!r}].ids is {len(entry.ids)} bytes, "
                                 "not a whole number of int64s")
        if len(entry.ids) // 8 > MAX_PULL_IDS:
            raise EmbeddingError(f"EmbeddingRequest.tables[{entry.table!r}] asks for {len(entry.ids) // 8} ids, "
                                 f"at most {MAX_PULL_IDS}")
        found[entry.table] = np.frombuffer(entry.ids, "<i8").astype(np.int64)
    return found
