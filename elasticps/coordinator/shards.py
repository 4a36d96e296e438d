"""The coordinator's line to every PS shard: commit a sync round on all of them, ask their versions.

Used by the coordinator's engine (``syncing.py``, ``watching.py``), which decides rounds (``rounds.py``) and has
:class:`Shards` carry them out. A round is committed in two phases, so it is applied by every shard or
by none: first every shard checks that it is at the round's version and holds every named gradient
(``dry_run``), then every shard applies it. A shard that refuses the check aborts the round before
anything changed (a shard that restarted has lost its staged gradients: the members train again).

PS 0's own shard is reached in-process (``ps/main.py`` adapts its store to :class:`ShardLink`); the
others through :class:`RemoteShard`, over gRPC. Shard calls run in parallel.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc
from elasticps.rpc.channels import create_channel
from elasticps.rpc.status import Failure, classify, retrying

T = TypeVar("T")
log = logging.getLogger(__name__)

COMMIT_DEADLINE_S = 60.0  # a shard that stays unreachable this long fails the commit (it is retried later)
DESCRIBE_TIMEOUT_S = 1.0


class ShardRefused(Exception):
    """A shard said no to a round (not at its version, a gradient missing, no model)."""

    def __init__(self, shard: int, why: str) -> None:
        super().__init__(f"PS shard {shard}: {why}")
        self.shard = shard


class ShardsStopping(ShardRefused):
    """PS 0 is stopping: a call that waits to retry a shard gives up now (not after its deadline)."""

    def __init__(self, shard: int) -> None:
        super().__init__(shard, "PS 0 is stopping")


class RoundAborted(Exception):
    """A shard refused a round's check: no shard applied it."""


@dataclass(frozen=True)
class ShardView:
    initialized: bool
    version: int
    boot: int  # new for each start of the shard's process
    incarnation: int = 0
    checkpoints: tuple[int, ...] = ()
    bytes_received: int = 0  # tensor bytes, over the shard process's life
    bytes_sent: int = 0
    unreadable: tuple[str, ...] = ()  # checkpoint files that do not read back: "<file>: <why>"
    checkpoint_failure: str = ""  # why its latest checkpoint write failed ("": it did not)
    embedding_rows: int = 0  # held now, all tables
    embedding_rows_made: int = 0  # since the shard's process started
    embedding_rows_evicted: int = 0

    @staticmethod
    def of(state: pb.ShardState) -> ShardView:
        return ShardView(
            state.initialized,
            state.version,
            state.boot,
            state.incarnation,
            tuple(state.checkpoints),
            state.tensor_bytes_received,
            state.tensor_bytes_sent,
            tuple(state.unreadable),
            state.checkpoint_failure,
            state.embedding_rows,
            state.embedding_rows_made,
            state.embedding_rows_evicted,
        )


@dataclass(frozen=True)
class TaskAdvance:
    """How far a committed round brought a training task (``TaskProgress`` on the wire): its
    epoch, its first record as it was cut, the first of its records not applied, its id."""

    epoch: int
    first: int
    reached: int
    task_id: int

    def message(self) -> pb.TaskProgress:
        return pb.TaskProgress(epoch=self.epoch, first=self.first, reached=self.reached, task_id=self.task_id)


@dataclass(frozen=True)
class LedgerView:
    """A shard's copy of the task ledger (``ps/applied.py``): the tasks the rounds it applied up to
    ``version`` brought forward; ``whole`` when it applied every round since version 0."""

    version: int
    whole: bool
    tasks: tuple[TaskAdvance, ...]

    @staticmethod
    def of(copy: pb.LedgerCopy) -> LedgerView:
        tasks = tuple(TaskAdvance(t.epoch, t.first, t.reached, t.task_id) for t in copy.tasks)
        return LedgerView(copy.version, copy.whole, tasks)


class ShardLink(Protocol):
    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        """Applies (or with ``dry_run`` checks) the round, bringing ``tasks`` forward in the shard's
        copy of the ledger and keeping its checkpoint of version ``restorable`` (0: none); the
        shard's version after it. Raises :class:`ShardRefused` when the shard cannot."""

    def read_ledger(self) -> LedgerView:
        """The shard's copy of the task ledger."""

    def describe(self) -> ShardView: ...

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        """Installs the shard's checkpoint of ``version`` as model ``(incarnation, version)``;
        raises :class:`ShardRefused` when the shard has no good checkpoint of it."""


class RemoteShard:
    def __init__(self, index: int, address: str, stopping: threading.Event | None = None) -> None:
        self.index = index
        self._channel = create_channel(address)
        self._stub = pb_grpc.ParameterServerStub(self._channel)
        self._stopping = stopping or threading.Event()

    def _sleep(self, seconds: float) -> None:
        """Between retries; a PS that is stopping does not wait out a dead shard's deadline."""
        if self._stopping.wait(seconds):
            raise ShardsStopping(self.index)

    def _call(self, call: Callable[[], T], what: str) -> T:
        """Retries transient failures until the commit deadline; any other answer is a refusal."""
        try:
            return retrying(call, what=what, deadline_s=COMMIT_DEADLINE_S, sleep=self._sleep)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            if code is not None and classify(code) is not Failure.TRANSIENT:
                raise ShardRefused(self.index, err.details() or str(code)) from err
            raise

    def commit(self, round_: int, workers: Sequence[str], dry_run: bool, tasks: Sequence[TaskAdvance] = (),
               restorable: int = 0) -> int:  # fmt: skip
        request = pb.CommitRequest(round=round_, workers=list(workers), dry_run=dry_run,
                                   applied=[task.message() for task in tasks], restorable=restorable)  # fmt: skip
        reply: pb.CommitReply = self._call(lambda: self._stub.CommitRound(request, timeout=10.0), "CommitRound")
        return reply.version

    def read_ledger(self) -> LedgerView:
        copy: pb.LedgerCopy = self._stub.ReadLedger(pb.LedgerRequest(), timeout=60.0)
        return LedgerView.of(copy)

    def describe(self) -> ShardView:
        state: pb.ShardState = self._stub.DescribeShard(pb.DescribeRequest(), timeout=DESCRIBE_TIMEOUT_S)
        return ShardView.of(state)

    def roll_back(self, version: int, incarnation: int) -> ShardView:
        request = pb.RestoreRequest(version=version, incarnation=incarnation)
        state: pb.ShardState = self._call(lambda: self._stub.RestoreShard(request, timeout=60.0), "RestoreShard")
        return ShardView.of(state)

    def close(self) -> None:
        self._channel.close()


class Shards:
    def __init__(self, links: Sequence[ShardLink]) -> None:
        if not links:
            raise ValueError("at least one shard is needed")
        self._links = list(links)
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(links)), thread_name_prefix="shards")

    def __len__(self) -> int:
        return len(self._links)

    def commit(
        self, round_: int, workers: Sequence[str], tasks: Sequence[TaskAdvance] = (), restorable: int = 0
    ) -> list[int]:
        """Applies the round on every shard, after every shard said it can, bringing ``tasks``
        forward in every shard's copy of the ledger (and keeping every shard's checkpoint of
        ``restorable``); each shard's version.

        Raises :class:`RoundAborted` when a shard refused the check (nothing was applied); any other
        error leaves the round half applied and the caller must retry it (a commit is idempotent)."""
        try:
            self._each(lambda link: link.commit(round_, workers, True))
        except ShardRefused as err:
            raise RoundAborted(str(err)) from err
        return self._each(lambda link: link.commit(round_, workers, False, tasks, restorable))

    def ledger_copy(self, version: int) -> tuple[int, LedgerView] | None:
        """A shard's whole copy of the task ledger at ``version`` and the shard's index; None when
        no shard that answers holds one."""
        for index, link in enumerate(self._links):
            try:
                copy = link.read_ledger()
            except (grpc.RpcError, ShardRefused) as err:
                log.warning("PS %d did not give its copy of the task ledger: %s", index, err)
                continue
            if copy.whole and copy.version == version:
                return index, copy
        return None

    def describe(self) -> list[ShardView | None]:
        """Every shard's state; None for a shard that did not answer in time."""

        def ask(link: ShardLink) -> ShardView | None:
            try:
                return link.describe()
            except grpc.RpcError:
                return None

        return self._each(ask)

    def describe_all(self, deadline_s: float) -> list[ShardView]:
        """Every shard's state, waiting (up to ``deadline_s``) for shards that are still starting."""
        def ask(link: ShardLink) -> ShardView:
            sleep = link._sleep if isinstance(link, RemoteShard) else time.sleep
            return retrying(link.describe, what="DescribeShard", deadline_s=deadline_s, sleep=sleep)

        return self._each(ask)

    def roll_back(self, version: int, incarnation: int) -> list[ShardView]:
        """Rolls every shard back to its checkpoint of ``version``, as model ``(incarnation, version)``."""
        return self._each(lambda link: link.roll_back(version, incarnation))

    def _each(self, call: Callable[[ShardLink], T]) -> list[T]:
        if len(self._links) == 1:
            return [call(self._links[0])]
        return list(self._pool.map(call, self._links))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for link in self._links:
            if isinstance(link, RemoteShard):
                link.close()
