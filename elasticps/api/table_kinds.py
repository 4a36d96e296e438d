"""The kinds of table a PS shard holds (issue 32): the one name both sides of the wire agree on. Pure.

Every model has a dense table (its trainable variables) and a state table (its non-trainable float
variables): those two are implicit, made from the tensors a worker pushes. Every other table is
declared by a :class:`~elasticps.api.embedding.TableSpec` whose ``kind`` says what it is; a spec
sent or saved without a kind (any peer or checkpoint from before kinds) means an embedding table.

What a kind does lives on each side, found through a registry keyed by this enum: the shard's
factory and restore (``ps/kinds.py``), the client's splitter (``psclient/kinds.py``) and the wire
codec of its spec (``rpc/embedding_wire.py``). A test checks that each registry covers every member.
"""

from __future__ import annotations

import enum

__all__ = ["DECLARED", "DEFAULT_KIND", "IMPLICIT", "TableKind"]


class TableKind(str, enum.Enum):
    DENSE = "dense"  # the model's variables: one per model, split by the client's placement
    STATE = "state"  # the model's non-trainable float state, placed with the variables
    EMBEDDING = "embedding"  # rows keyed by int64 id, row ``id`` on shard ``id mod N``, made on first pull


IMPLICIT = frozenset({TableKind.DENSE, TableKind.STATE})  # in every model; never declared by a spec
DECLARED = frozenset(TableKind) - IMPLICIT  # what a TableSpec may name
DEFAULT_KIND = TableKind.EMBEDDING  # of a spec that names none (older peers, older checkpoints)
