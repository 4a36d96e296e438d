"""A decentralized worker's calls to its graph neighbours (the Peer service, ``servicer.py``).

* :meth:`Peers.send`: non-blocking. Each out-neighbour has a sender thread and a FIFO of the models
  still to deliver, in iteration order (every iteration's model matters under the standard rule, so
  a newer one never replaces an older one in the FIFO). A model the receiver can no longer use (its
  last known iteration is past the model's usable window) is not sent (seed 004, section 6.2).
* :meth:`Peers.take_tokens`: blocks until every out-neighbour gave the tokens to enter ``count``
  more iterations (a long poll per neighbour, asked again until it answers); a neighbour that left
  needs none.
* :meth:`Peers.lags`: how far each out-neighbour is ahead (its tokens for this worker - max_ig), for
  the jump decision.
* :meth:`Peers.excuse`: tells the out-neighbours which iterations this worker sends nothing for.

A neighbour that cannot be reached (its pod is being replaced) is asked again every
``retry_s`` until ``give_up_s`` passes; then :class:`PeerUnreachable`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import numpy as np

from elasticps.decentralized.servicer import MAX_TOKENS, MAX_WAIT_MS, PEER_SERVICE
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import frames
from elasticps.rpc.channels import create_channel

log = logging.getLogger(__name__)
T = TypeVar("T")
Model = Mapping[str, np.ndarray]

# A neighbour restarting or going away: its server ends the calls in flight (CANCELLED), then
# refuses connections (UNAVAILABLE) until it is back.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


class PeerUnreachable(ConnectionError):
    """A neighbour did not answer for ``give_up_s``."""


class _Gone(Exception):
    """The neighbour left while a call to it was failing: nothing more to ask of it."""


@dataclass
class _Link:
    """One neighbour: its channel, its methods, what it last said of itself."""

    worker: int
    address: str
    channel: grpc.Channel
    iteration: int = -1  # the neighbour's newest known iteration
    outbox: deque[tuple[int, Model]] = field(default_factory=deque)
    sent: int = 0
    skipped: int = 0
    refused: str = ""  # the neighbour refused a model (INVALID_ARGUMENT): nothing more goes there

    def __post_init__(self) -> None:
        path = f"/{PEER_SERVICE.full_name}/"
        self.send_model: grpc.StreamUnaryMultiCallable[bytes, pb.PeerReply] = self.channel.stream_unary(
            path + "SendModel", request_serializer=None, response_deserializer=pb.PeerReply.FromString
        )
        self.take_tokens: grpc.UnaryUnaryMultiCallable[pb.TokenRequest, pb.TokenReply] = self.channel.unary_unary(
            path + "TakeTokens", request_serializer=pb.TokenRequest.SerializeToString, response_deserializer=pb.TokenReply.FromString
        )
        self.excuse: grpc.UnaryUnaryMultiCallable[pb.ExcuseRequest, pb.PeerReply] = self.channel.unary_unary(
            path + "Excuse", request_serializer=pb.ExcuseRequest.SerializeToString, response_deserializer=pb.PeerReply.FromString
        )
        self.pull_model: grpc.UnaryStreamMultiCallable[pb.PeerModelRequest, bytes] = self.channel.unary_stream(
            path + "PullModel", request_serializer=pb.PeerModelRequest.SerializeToString, response_deserializer=None
        )

    def heard(self, iteration: int) -> None:
        """The neighbour's iteration, as a reply said (a rejoined one may be behind the last)."""
        self.iteration = iteration


class Peers:
    def __init__(self, me: int, addresses: Mapping[int, str], outs: Sequence[int], oldest_usable: Callable[[int], int],
                 max_ig: int, gone: Callable[[int], bool] = lambda worker: False,
                 on_left: Callable[[int], None] = lambda worker: None, retry_s: float = 0.5,
                 give_up_s: float = 300.0, timeout_s: float = 60.0) -> None:
        """``addresses``: every neighbour (in and out) -> its Peer address; ``outs``: the
        out-neighbours (models and tokens); ``oldest_usable``: the job's rule (the oldest tag a
        worker at an iteration may still reduce); ``gone``: whether a neighbour said it left (its
        Excuse reached this worker's Peer service), so it is neither sent to nor asked; ``on_left``:
        told when a reply says a neighbour left (``gone`` answers for it from then on)."""
        self.me = me
        self.max_ig = max_ig
        self._gone = gone
        self._on_left = on_left
        self._oldest_usable = oldest_usable
        self._retry_s = retry_s
        self._give_up_s = give_up_s
        self._timeout_s = timeout_s
        self._all = {j: _Link(j, address, create_channel(address)) for j, address in sorted(addresses.items())}
        missing = [j for j in outs if j not in self._all]
        if missing:
            raise ValueError(f"no address for out-neighbours {missing}")
        self._links = {j: self._all[j] for j in sorted(outs)}
        self._lock = threading.Condition()
        self._closed = False
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._sender, args=(link,), name=f"peer-send-{j}", daemon=True)
                         for j, link in self._links.items()]
        for thread in self._threads:
            thread.start()

    # -- models -----------------------------------------------------------------------------------

    def send(self, iteration: int, model: Model) -> None:
        """Queue ``model`` (sent in ``iteration``) for every out-neighbour; returns at once. The
        arrays must not change afterwards (pass a copy of a live model)."""
        self.raise_sender_error()
        with self._lock:
            for link in self._links.values():
                if not self._left(link) and not link.refused:
                    link.outbox.append((iteration, model))
            self._lock.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Waits until every queued model went out (or was skipped); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while any(link.outbox for link in self._links.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def _sender(self, link: _Link) -> None:
        while True:
            with self._lock:
                while not link.outbox and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                iteration, model = link.outbox[0]
                useless = self._left(link) or iteration < self._oldest_usable(link.iteration)
            if not useless:
                try:
                    reply = self._retry(link, lambda: link.send_model(
                        frames.encode(pb.Frame(peer=pb.PeerHead(sender=self.me, iteration=iteration)), model),
                        timeout=self._timeout_s))
                except grpc.RpcError as err:  # the neighbour refused it (another model?): the job cannot go on
                    link.refused = str(err.details()) or str(err.code())
                    log.error("worker %d refused this worker's model: %s", link.worker, link.refused)
                    with self._lock:
                        self._errors.append(err)
                except PeerUnreachable as err:
                    with self._lock:
                        self._errors.append(err)
                except _Gone:
                    link.skipped += 1
                else:
                    self._heard(link, reply.iteration, reply.left)
                    link.sent += 1
            else:
                link.skipped += 1
            with self._lock:
                if link.outbox:
                    link.outbox.popleft()
                if link.refused:
                    link.outbox.clear()
                self._lock.notify_all()

    # -- tokens and excuses -----------------------------------------------------------------------

    def take_tokens(self, count: int) -> None:
        """Enter ``count`` more iterations: a token (``count`` of them) from every out-neighbour,
        waiting as long as they take to give them."""
        for link in self._links.values():
            while not self._left(link):
                try:
                    reply = self._retry(link, lambda: link.take_tokens(
                        pb.TokenRequest(worker=self.me, count=count, wait_ms=MAX_WAIT_MS // 2), timeout=self._timeout_s))
                except _Gone:
                    break
                self._heard(link, reply.iteration, reply.left)
                if reply.taken or reply.left:
                    break

    def lags(self) -> list[float]:
        """Each out-neighbour's lead over this worker (its tokens for this worker - max_ig); a
        neighbour that left has none (inf)."""
        found: list[float] = []
        for link in self._links.values():
            if self._left(link):
                found.append(float("inf"))
                continue
            try:
                reply = self._retry(link, lambda: link.take_tokens(pb.TokenRequest(worker=self.me, count=0),
                                                                   timeout=self._timeout_s))
            except _Gone:
                found.append(float("inf"))
                continue
            self._heard(link, reply.iteration, reply.left)
            found.append(float("inf") if reply.left or reply.available >= MAX_TOKENS else reply.available - self.max_ig)
        return found

    def excuse(self, through: int, left: bool = False) -> None:
        """This worker sends nothing for the iterations up to ``through`` (its out-neighbours stop
        waiting for it there), or, ``left``, it leaves: every neighbour, in or out, stops waiting
        for its models and asking for its tokens."""
        for link in (self._all if left else self._links).values():
            if self._left(link):
                continue
            try:
                reply = self._retry(link, lambda: link.excuse(pb.ExcuseRequest(sender=self.me, through=through, left=left),
                                                              timeout=self._timeout_s))
            except _Gone:
                continue
            self._heard(link, reply.iteration, reply.left)

    # -- plumbing ----------------------------------------------------------------------------------

    def _left(self, link: _Link) -> bool:
        return self._gone(link.worker)

    def _heard(self, link: _Link, iteration: int, left: bool) -> None:
        link.heard(iteration)
        if left:
            self._on_left(link.worker)

    # -- a replaced worker's return ------------------------------------------------------------------

    def survey(self) -> dict[int, tuple[int, int]]:
        """Each out-neighbour's iteration and its tokens for this worker (``TakeTokens`` of 0)."""
        found: dict[int, tuple[int, int]] = {}
        for j, link in self._links.items():
            reply = self._retry(link, lambda: link.take_tokens(pb.TokenRequest(worker=self.me, count=0), timeout=self._timeout_s))
            if not reply.left:
                found[j] = (reply.iteration, reply.available)
        return found

    def take_from(self, worker: int, count: int) -> None:
        """``count`` tokens from out-neighbour ``worker`` alone, waiting for them."""
        link = self._links[worker]
        while count > 0 and not self._left(link):
            reply = self._retry(link, lambda: link.take_tokens(
                pb.TokenRequest(worker=self.me, count=count, wait_ms=MAX_WAIT_MS // 2), timeout=self._timeout_s))
            if reply.taken or reply.left:
                return

    def announce_rejoin(self, through: int) -> dict[int, int]:
        """Tells every neighbour this worker is back from iteration ``through + 1``; their iterations."""
        found: dict[int, int] = {}
        for j, link in self._all.items():
            reply = self._retry(link, lambda: link.excuse(pb.ExcuseRequest(sender=self.me, through=through, rejoin=True),
                                                          timeout=self._timeout_s))
            found[j] = reply.iteration
        return found

    def pull_newest(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """The newest model any neighbour sent (its iteration and tensors); None when none has one."""
        best: tuple[int, dict[str, np.ndarray]] | None = None
        for link in self._all.values():
            try:
                decoded = frames.decode(link.pull_model(pb.PeerModelRequest(worker=self.me), timeout=self._timeout_s))
            except grpc.RpcError:
                continue  # not started yet, or without a model: another neighbour may have one
            iteration = decoded.first.peer.iteration
            if best is None or iteration > best[0]:
                best = (iteration, dict(decoded.tensors))
        return best

    def _retry(self, link: _Link, call: Callable[[], T]) -> T:
        give_up_at = time.monotonic() + self._give_up_s
        while True:
            try:
                return call()
            except grpc.RpcError as err:
                if self._left(link):
                    raise _Gone() from None
                if err.code() not in RETRYABLE:
                    raise
                if time.monotonic() >= give_up_at:
                    raise PeerUnreachable(f"worker {link.worker} at {link.address}: no answer for {self._give_up_s:.0f} s "
                                          f"({err.details()})") from None
                time.sleep(self._retry_s)

    def raise_sender_error(self) -> None:
        with self._lock:
            if self._errors:
                raise self._errors[0]

    def counts(self) -> dict[str, Any]:
        """Models sent and skipped per out-neighbour, for logs and tests."""
        return {str(j): {"sent": link.sent, "skipped": link.skipped, "refused": link.refused}
                for j, link in self._links.items()}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        for link in self._all.values():
            link.channel.close()

