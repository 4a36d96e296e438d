"""The Peer gRPC service of a decentralized worker: what its graph neighbours call (seed 004).

* ``SendModel`` (a stream of the project's frames, raw bytes in chunks): an in-neighbour's model of
  one iteration, checked before any buffer exists (its names, shapes and dtypes must be this
  worker's model's) and after (finite numbers only), then put in the update queue. The reply says
  whether it was kept and this worker's iteration, so the sender can skip sends it cannot use.
* ``TakeTokens``: an in-neighbour enters new iterations; the call waits on the server's event loop
  (no thread held) until the tokens are there or ``wait_ms`` passes.
* ``Excuse``: an in-neighbour skipped iterations or left.
* ``PullModel``: the newest model this worker sent, for a replaced neighbour to rejoin with.

Anything a peer could get wrong is INVALID_ARGUMENT with a message; nothing of a refused call
reaches the queues.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

import grpc
import numpy as np
from grpc import aio

from elasticps import identity
from elasticps.decentralized.peer_state import PeerState
from elasticps.decentralized.queues import Update
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import edges, frames, guard, receiving
from elasticps.rpc.limits import ServerLimits
from elasticps.rpc.serving import AsyncServer

Context = aio.ServicerContext[Any, Any]
Model = dict[str, np.ndarray]
PEER_SERVICE = pb.DESCRIPTOR.services_by_name["Peer"]
MAX_WAIT_MS = 10_000
MAX_TOKENS = 1 << 30  # far above any real jump


class PeerServicer:
    def __init__(self, state: PeerState[Model], layout: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]] | None = None,
                 limits: ServerLimits = ServerLimits()) -> None:
        """``layout``: this worker's model, name -> (shape, dtype): what a neighbour's must match;
        until it is known (:meth:`ready`, once the model is built) models are answered UNAVAILABLE,
        which their senders retry."""
        self._state = state
        self._layout = dict(layout) if layout is not None else None
        self._limits = limits
        self._workers = state.graph.size

    async def SendModel(self, request_iterator: AsyncIterable[bytes], context: Context) -> pb.PeerReply:
        decoded = await receiving.receive(request_iterator, context, "SendModel", self._limits, self._admit)
        head = decoded.first.peer
        for name, value in decoded.tensors.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"SendModel: tensor {name!r} of worker {head.sender} holds NaN or infinity")
        kept, iteration, left = self._state.receive(Update(head.iteration, head.sender, dict(decoded.tensors)))
        return pb.PeerReply(kept=kept, iteration=iteration, left=left)

    def ready(self, model: Mapping[str, np.ndarray]) -> None:
        """The worker's model is built: neighbours' models must look like it."""
        self._layout = {name: (tuple(value.shape), value.dtype) for name, value in model.items()}

    def _admit(self, head: frames.Head) -> None:
        layout = self._layout
        if layout is None:
            raise receiving.Refused(grpc.StatusCode.UNAVAILABLE, f"worker {self._state.me} is still building its model")
        first = head.first
        if first.WhichOneof("head") != "peer":
            raise receiving.Refused(grpc.StatusCode.INVALID_ARGUMENT, "SendModel: the first frame must carry a peer head")
        self._check_worker(first.peer.sender, "sender")
        claimed = guard.claimed_worker(first.peer.sender, index=True)
        if (problem := identity.claim_refusal(guard.caller(), claimed, "SendModel: sender")) is not None:
            raise receiving.Refused(grpc.StatusCode.PERMISSION_DENIED, problem)
        if first.peer.iteration < 0:
            raise receiving.Refused(grpc.StatusCode.INVALID_ARGUMENT, f"SendModel: iteration {first.peer.iteration} < 0")
        got = {t.name: (t.shape, t.dtype) for t in head.tensors}
        if set(got) != set(layout):
            missing = sorted(set(layout) - set(got))
            extra = sorted(set(got) - set(layout))
            raise receiving.Refused(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"SendModel: not this job's model (missing {missing[:3]}, unknown {extra[:3]})")
        for name, (shape, dtype) in got.items():
            want_shape, want_dtype = layout[name]
            if tuple(shape) != tuple(want_shape) or np.dtype(dtype) != np.dtype(want_dtype):
                raise receiving.Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"SendModel: tensor {name!r} is {np.dtype(dtype)}{list(shape)}, this model's is {np.dtype(want_dtype)}{list(want_shape)}",
                )

    def _check_worker(self, worker: int, what: str) -> None:
        if not 0 <= worker < self._workers:
            raise receiving.Refused(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{what} {worker} is not a worker of this job (0..{self._workers - 1})")

    async def TakeTokens(self, request: pb.TokenRequest, context: Context) -> pb.TokenReply:
        if self._layout is None and request.count > 0:  # its tokens are not settled yet (a rejoin)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self._state.me} is still starting")
        worker = request.worker
        if worker not in self._state.graph.in_neighbours(self._state.me):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"TakeTokens: worker {worker} is not an in-neighbour of worker {self._state.me}")
        if not 0 <= request.count <= MAX_TOKENS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"TakeTokens: count {request.count} not in [0, {MAX_TOKENS}]")
        taken = False
        if request.count > 0:
            wait_s = min(max(request.wait_ms, 0), MAX_WAIT_MS) / 1000
            taken = await self._state.changes.wait_for(lambda: self._state.try_take(worker, request.count), wait_s)
        return self._token_reply(worker, taken)

    def _token_reply(self, worker: int, taken: bool) -> pb.TokenReply:
        available = self._state.tokens(worker)
        return pb.TokenReply(taken=taken, available=MAX_TOKENS if math.isinf(available) else int(available),
                             left=self._state.left, iteration=self._state.iteration)

    def Excuse(self, request: pb.ExcuseRequest, context: grpc.ServicerContext) -> pb.PeerReply:
        if not 0 <= request.sender < self._workers or request.through < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"Excuse: sender {request.sender} / through {request.through} out of range")
        if request.rejoin:
            self._state.neighbour_rejoined(request.sender, request.through)
        elif request.left:
            self._state.neighbour_left(request.sender)
        else:
            self._state.excuse(request.sender, request.through)
        return pb.PeerReply(kept=True, iteration=self._state.iteration, left=self._state.left)

    async def PullModel(self, request: pb.PeerModelRequest, context: Context) -> AsyncIterator[bytes]:
        newest = self._state.newest_model()
        if newest is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"PullModel: worker {self._state.me} has not sent a model yet")
            return
        iteration, model = newest
        head = pb.Frame(peer=pb.PeerHead(sender=self._state.me, iteration=iteration))
        for message in frames.encode(head, model):
            yield message


def add_to_server(servicer: PeerServicer, server: AsyncServer) -> None:
    """Registers the Peer service; the model streams travel as bytes (``frames``), the small
    messages through protobuf (one that does not parse: INVALID_ARGUMENT, ``rpc/edges.py``)."""
    handlers = {
        "SendModel": grpc.stream_unary_rpc_method_handler(
            servicer.SendModel, request_deserializer=None, response_serializer=pb.PeerReply.SerializeToString
        ),
        "TakeTokens": edges.unary_unary(
            servicer.TakeTokens, "TakeTokens", pb.TokenRequest.FromString, pb.TokenReply.SerializeToString
        ),
        "Excuse": edges.unary_unary(servicer.Excuse, "Excuse", pb.ExcuseRequest.FromString, pb.PeerReply.SerializeToString),
        "PullModel": edges.unary_stream(servicer.PullModel, "PullModel", pb.PeerModelRequest.FromString, None),
    }
    declared = set(PEER_SERVICE.methods_by_name)
    if declared != set(handlers):  # the .proto is the one definition: fail loudly if they drift
        raise RuntimeError(f"Peer methods {sorted(declared)} != handlers {sorted(handlers)}")
    server.add_service(PEER_SERVICE.full_name, handlers)
