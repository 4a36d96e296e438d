"""Which push and model streams a shard takes, judged from their head alone, before their payload.

Pure decisions, called by the servicer (``servicer.py``) through ``rpc/receiving.py`` as soon as a
stream's first frame arrived; each raises ``Refused`` with the status code and a message naming
what is wrong. The store checks everything again once the tensors are whole (values included):
this is the cheap, early part, which keeps a stream from being buffered when its head already
tells it cannot be taken.

* **PushGradients**: a shard with no model refuses it (FAILED_PRECONDITION, as the store would);
  every tensor must be one of the model's variables or state tensors, with its dtype and shape, or
  a part of one of its embedding tables (``ids``: int64 [n]; ``gradient``: float32 [n, dim]; at
  most :data:`MAX_PUSH_ROWS` rows) (INVALID_ARGUMENT), and the stream's bytes at most
  :func:`stream_cap` of the model.
* **PushModel**: while the shard holds no model (or an empty one), at most ``max_model_bytes``
  (``--max_model_bytes``, INVALID_ARGUMENT); once it holds one, a model larger than
  :func:`stream_cap` of it is another model (FAILED_PRECONDITION, as a mismatch is).
"""

from __future__ import annotations

import grpc
import numpy as np

from elasticps.api.embedding import PART_GRADIENT, PART_IDS
from elasticps.ps.layout import Layout
from elasticps.rpc.frames import Head, TensorSpec
from elasticps.rpc.receiving import Refused

MIN_HEADROOM_BYTES = 16 << 20
MAX_PUSH_ROWS = 1 << 20  # rows of one embedding table in one push (a minibatch's distinct ids)


def stream_cap(layout: Layout) -> int:
    """The most tensor bytes one stream to this model may declare: the model's bytes, room for
    state tensors a table that adopts takes beyond them (a quarter, at least 16 MiB), and for each
    embedding table :data:`MAX_PUSH_ROWS` ids with their gradients."""
    rows = sum(MAX_PUSH_ROWS * (8 + 4 * spec.dim) for spec in layout.tables.values())
    return layout.nbytes + max(MIN_HEADROOM_BYTES, layout.nbytes // 4) + rows


def _admit_rows(tensor: TensorSpec, layout: Layout, shard: int) -> None:
    spec = layout.tables.get(tensor.table)
    if spec is None:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                      f"PushGradients: PS shard {shard} holds no embedding table {tensor.table!r}")
    expected = {PART_IDS: (np.dtype(np.int64), 1), PART_GRADIENT: (np.dtype(np.float32), 2)}.get(tensor.name)
    if expected is None:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                      f"PushGradients: embedding table {tensor.table!r} has no part {tensor.name!r} (ids, gradient)")
    dtype, rank = expected
    shape_ok = len(tensor.shape) == rank and (rank == 1 or tensor.shape[1] == spec.dim)
    if tensor.dtype != dtype or not shape_ok or tensor.shape[0] > MAX_PUSH_ROWS:
        wanted = f"{dtype}[n]" if rank == 1 else f"{dtype}[n, {spec.dim}]"
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                      f"PushGradients: embedding table {tensor.table!r}: {tensor.name} is "
                      f"{tensor.dtype}{list(tensor.shape)}, expected {wanted} with n <= {MAX_PUSH_ROWS}")


def admit_push(head: Head, layout: Layout | None, shard: int) -> None:
    if not head.first.HasField("push"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "PushGradients: the first frame needs a push head")
    if layout is None:
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"PS shard {shard} holds no model yet")
    for tensor in head.tensors:
        if tensor.table:
            _admit_rows(tensor, layout, shard)
            continue
        held = layout.state if tensor.state else layout.variables
        spec = held.get(tensor.name)
        kind = "state tensor" if tensor.state else "variable"
        if spec is None:
            if tensor.state and layout.adopts_state:
                continue
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PushGradients: {tensor.name!r} is not a {kind} of PS shard {shard}",
            )
        if (tensor.dtype, tensor.shape) != spec:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PushGradients: {kind} {tensor.name!r} is {tensor.dtype}{list(tensor.shape)} in the push, "
                f"{spec[0]}{list(spec[1])} on PS shard {shard}",
            )
    cap = stream_cap(layout)
    if head.total > cap:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"PushGradients: the stream declares {head.total} tensor bytes, more than the {cap} a push to "
            f"PS shard {shard} may carry (its model's {layout.nbytes} bytes and headroom)",
        )


def admit_model(head: Head, layout: Layout | None, shard: int, max_model_bytes: int) -> None:
    if not head.first.HasField("model"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "PushModel: the first frame needs a model head")
    if layout is None or layout.empty:
        if head.total > max_model_bytes:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PushModel: the model declares {head.total} tensor bytes, more than PS shard {shard} takes "
                f"(--max_model_bytes={max_model_bytes})",
            )
        return
    if head.total > stream_cap(layout):
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"PS shard {shard} holds another model: the pushed one's tensors are {head.total} bytes, "
            f"the held one's {layout.nbytes}",
        )
