"""The coordinator's face on PS 0's bulk channel: ``JoinRound`` written behind a worker's push.

``ps/bulk.py`` hands the join over in the connection's thread; the answer is the one gRPC gives
(``joins.py``), waited for in that thread, so the thread that commits a round wakes it directly.
Waiting joins are bounded by the channel's connections (``--max_push_streams``). Refusals raise
:class:`~elasticps.rpc.receiving.Refused` with the status gRPC would answer.
"""

from __future__ import annotations

from elasticps.coordinator import joins
from elasticps.coordinator.engine import Coordinator
from elasticps.coordinator.syncing import CommitFailed
from elasticps.proto import elasticps_pb2 as pb


class BulkJoins:
    """A ``ps.bulk.Joiner``: call it with the request, get the reply."""

    def __init__(self, engine: Coordinator) -> None:
        self._engine = engine

    def __call__(self, request: pb.JoinRequest) -> pb.JoinReply:
        join = joins.decode(self._engine, request)
        try:
            return joins.encode(self._engine.join(join, request.wait_ms))
        except CommitFailed as err:
            raise joins.not_committed(err) from None
