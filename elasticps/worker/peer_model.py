"""The decentralized worker's model and step (``spec.strategy: decentralized``, seed 004's Hop).

No PS: the worker's own Keras model is the model. :class:`PeerModel` stands where
``LocalModel`` stands for a PS job (what the training loop asks of its model: the first model, the
model to evaluate and to export), and :class:`HopStep` is the step the loop hands each minibatch:
one iteration of Hop's parallel variant (``decentralized/loop.py``): send ``x(k)``, compute the
gradient on it, reduce the neighbours' models of the iteration, apply the
gradient to the reduced model with the worker's own optimizer (its momentum kept from iteration to
iteration: its own descent direction), enter the next iteration. A worker slowed on purpose sleeps
after the whole iteration's work, not only the gradient's (:meth:`PeerModel.slow`): without a PS,
averaging the neighbours' models is the worker's own work too, and a slower processor is slower at
all of it.

Every worker starts from worker 0's initial weights (pulled from its Peer service), so the models
to average begin equal. A worker with no task (the coordinator answers WAIT: the epoch's last
tasks are elsewhere, an evaluation runs) keeps iterating without data (:meth:`HopStep.idle`): its
neighbours may be waiting for its models, and its model keeps mixing. When the job is finished (or
the worker is stopped) it leaves: its neighbours stop waiting for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from elasticps.decentralized.loop import Hop
from elasticps.decentralized.peer_state import PeerState
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import frames
from elasticps.rpc.channels import create_channel
from elasticps.worker.local_model import Counters, paced_gradients
from elasticps.worker.metrics import WorkerMetrics
from elasticps.worker.pacing import Pace
from elasticps.backends.api import Trainer

log = logging.getLogger(__name__)

IDLE_PAUSE_S = 0.2  # between iterations without data: the neighbours' pace, not a spin
INITIAL_PULL_S = 300.0  # how long a worker waits for worker 0's initial model


class PeerModel:
    def __init__(self, trainer: Trainer, state: PeerState[dict[str, np.ndarray]], first_address: str,
                 counters: Counters, metrics: WorkerMetrics, pace: Pace | None = None,
                 on_ready: Callable[[dict[str, np.ndarray]], None] = lambda model: None,
                 rejoin: Callable[[], tuple[int, dict[str, np.ndarray] | None] | None] = lambda: None) -> None:
        """``first_address``: worker 0's Peer service (the initial model); ``on_ready``: told the
        model once it is built (the Peer service then takes the neighbours' models and tokens);
        ``rejoin``: where a replacement goes on from (``Hop.rejoin``)."""
        self._on_ready = on_ready
        self._rejoin = rejoin
        self.counters = counters
        self.metrics = metrics
        self.trainer = trainer
        self.state = state
        self._first = first_address
        self._pace = pace

    @property
    def versions(self) -> list[int]:
        """The worker's iteration, in the place of the PS shards' versions."""
        return [self.state.iteration]

    def initialise(self) -> None:
        """Worker 0 keeps its initial weights and serves them; the others take them. A replacement
        of a worker that died or was removed goes on where that one stopped, with the newest model
        a neighbour sent."""
        rejoined = self._rejoin()
        if rejoined is not None:
            iteration, model = rejoined
            if model is not None:
                self.trainer.assign(model)
            log.info("worker %d rejoins at iteration %d", self.state.me, iteration)
            self._on_ready(self.trainer.weights())
            return
        self._on_ready(self.trainer.weights())
        if self.state.me == 0:
            self.state.sent(0, self.trainer.weights())
            return
        self.trainer.assign(self._pull_first())

    def _pull_first(self) -> dict[str, np.ndarray]:
        give_up_at = time.monotonic() + INITIAL_PULL_S
        channel = create_channel(self._first)
        pull = channel.unary_stream("/elasticps.v1.Peer/PullModel", request_serializer=pb.PeerModelRequest.SerializeToString,
                                    response_deserializer=None)
        try:
            while True:
                try:
                    decoded = frames.decode(pull(pb.PeerModelRequest(worker=self.state.me), timeout=60))
                    return dict(decoded.tensors)
                except grpc.RpcError as err:
                    retry = err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
                    if not retry or time.monotonic() > give_up_at:
                        raise
                    time.sleep(0.5)
        finally:
            channel.close()

    def refresh(self) -> None:
        """The model to evaluate is this worker's own, as it is now."""

    def pull_settled(self, wait_ms: int, attempts: int, strict: bool) -> int:
        """The model to export or predict with: this worker's own; its iteration names it."""
        return self.state.iteration

    def gradients(self, x: Any, y: Any) -> tuple[float, dict[str, np.ndarray]]:
        return paced_gradients(self.trainer, x, y, None, self.counters, self.metrics)

    def slow(self, busy_s: float) -> None:
        """The iteration worked ``busy_s`` seconds: a worker slowed on purpose sleeps what a slower
        processor would add (counted in ``counters.slowed_s``)."""
        if self._pace is not None:
            self.counters.slowed_s += self._pace.after(busy_s)


class HopStep:
    def __init__(self, model: PeerModel, hop: Hop[Any]) -> None:
        self._model = model
        self._hop = hop

    @property
    def counters(self) -> Any:
        return self._hop.counters

    def start_task(self, task_id: int = 0, epoch: int = 0) -> None:
        pass

    def train(self, x: Any, y: Any, records: int = 0) -> float:
        trainer = self._model.trainer
        losses: list[float] = []

        def compute(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            loss, gradients = self._model.gradients(x, y)
            losses.append(loss)
            return {name: np.array(g, copy=True) for name, g in gradients.items()}

        def apply(reduced: dict[str, np.ndarray], gradients: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            trainer.assign(reduced)
            trainer.apply_local(gradients)
            return trainer.weights()

        self._step(compute, apply)
        return losses[0]

    def idle(self) -> None:
        """An iteration without data: send, reduce, move on (the neighbours may wait for it)."""
        time.sleep(IDLE_PAUSE_S)
        trainer = self._model.trainer

        def apply(reduced: dict[str, np.ndarray], nothing: None) -> dict[str, np.ndarray]:
            trainer.assign(reduced)
            return reduced

        self._step(lambda weights: None, apply)

    def _step(self, compute: Any, apply: Any) -> None:
        trainer = self._model.trainer
        jumps = self._hop.counters.jumps
        model = self._hop.step(trainer.weights(), compute, apply, self._model.slow)
        if self._hop.counters.jumps != jumps:  # a jump reduced once more, after the apply
            trainer.assign(model)

    def end_task(self) -> None:
        pass

    def leave(self) -> None:
        try:
            self._hop.peers.flush(10)
            self._hop.leave()
        except Exception as err:  # best effort: a neighbour that is gone too needs no goodbye
            log.warning("could not tell every neighbour this worker leaves: %s", err)
        log.info("decentralized: %s", self._hop.counters)
