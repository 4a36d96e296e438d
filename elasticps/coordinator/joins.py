"""A join on the wire, the same for both faces (gRPC, ``servicer.py``; PS 0's bulk channel, ``bulk.py``):
the checks a ``JoinRequest`` passes before the engine sees it, and the ``JoinReply`` it gets.

Refusals are :class:`Refused` with the status gRPC answers, in this order: a job that trains
asynchronously (FAILED_PRECONDITION), a field out of range (INVALID_ARGUMENT, ``requests.py``), a
coordinator still asking the shards what they hold (UNAVAILABLE), a round a shard did not commit
(UNAVAILABLE).
"""

from __future__ import annotations

import grpc

from elasticps.coordinator import requests
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.rounds import Period
from elasticps.coordinator.syncing import CommitFailed, Join, JoinAnswer, Outcome
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc.receiving import Refused

NOT_READY = "the coordinator is still asking the PS shards what they hold"

_OUTCOMES = {
    Outcome.COMMITTED: pb.JOIN_OUTCOME_COMMITTED,
    Outcome.REFUSED: pb.JOIN_OUTCOME_REFUSED,
    Outcome.PENDING: pb.JOIN_OUTCOME_PENDING,
    Outcome.VOID: pb.JOIN_OUTCOME_VOID,
}


def decode(engine: Coordinator, request: pb.JoinRequest) -> Join:
    """The join ``request`` asks for; :class:`Refused` when it is refused before it looks at the rounds."""
    if not engine.synchronous:
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, "JoinRound: this job trains asynchronously")
    try:
        requests.check_join(request)
    except requests.RequestError as err:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
    if not engine.ready:
        raise Refused(grpc.StatusCode.UNAVAILABLE, NOT_READY)
    period = Period(request.local_steps, request.loss, request.learning_rate) if request.local_steps > 0 else None
    return Join(request.worker, request.version, period, request.task_id, request.task_records)


def encode(answer: JoinAnswer) -> pb.JoinReply:
    return pb.JoinReply(outcome=_OUTCOMES[answer.outcome], version=answer.version, local_steps=answer.local_steps)


def not_committed(err: CommitFailed) -> Refused:
    return Refused(grpc.StatusCode.UNAVAILABLE, f"JoinRound: a shard did not commit: {err}")
