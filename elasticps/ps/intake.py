"""Which push and model streams a shard takes, judged from their head alone, before their payload.

Pure decisions, called by the servicer (``servicer.py``) through ``rpc/receiving.py`` as soon as a
stream's first frame arrived; each raises ``Refused`` with the status code and a message naming
what is wrong. The store checks everything again once the tensors are whole (values included):
this is the cheap, early part, which keeps a stream from being buffered when its head already
tells it cannot be taken.

* **PushGradients**: a shard with no model refuses it (FAILED_PRECONDITION, as the store would);
  every tensor must be one of the model's variables or state tensors, with its dtype and shape
  (INVALID_ARGUMENT), and the stream's bytes at most :func:`stream_cap` of the model.
* **PushModel**: while the shard holds no model (or an empty one), at most ``max_model_bytes``
  (``--max_model_bytes``, INVALID_ARGUMENT); once it holds one, a model larger than
  :func:`stream_cap` of it is another model (FAILED_PRECONDITION, as a mismatch is).
"""

from __future__ import annotations

import grpc

from elasticps.ps.layout import Layout
from elasticps.rpc.frames import Head
from elasticps.rpc.receiving import Refused

MIN_HEADROOM_BYTES = 16 << 20


def stream_cap(layout: Layout) -> int:
    """The most tensor bytes one stream to this model may declare: the model's bytes, and room for
    state tensors a table that adopts takes beyond them (a quarter, at least 16 MiB)."""
    return layout.nbytes + max(MIN_HEADROOM_BYTES, layout.nbytes // 4)


def admit_push(head: Head, layout: Layout | None, shard: int) -> None:
    if not head.first.HasField("push"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "PushGradients: the first frame needs a push head")
    if layout is None:
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"PS shard {shard} holds no model yet")
    for tensor in head.tensors:
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
