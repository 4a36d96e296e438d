"""One iteration of Hop's parallel variant at one worker (seed 004, sections 3.2, 4 and 5).

1. Send: the model ``x(k)`` goes to every out-neighbour (non-blocking, ``peers.py``), and is kept
   for a rejoining neighbour to pull.
2. Compute: the gradient on ``x(k)`` (the caller's), while the sends travel.
3. Recv + Reduce: the models of iteration ``k`` per the rule (``rules.py``), averaged with the own
   by the graph's weights (renormalised over what came).
4. Apply: the gradient to the reduced model (the caller's). A worker slowed on purpose
   (``spec.training.slowdown``) then sleeps for the iteration's own work (compute, reduce, apply;
   not its waits), as a processor that many times slower would take: the caller's ``slow``.
5. Enter the next iteration: a token from every out-neighbour, or, for a straggler far enough behind
   all of them, the tokens of a jump: it tells them which iterations it skips, receives and reduces
   the models of the iteration before its target (``Recv(k - 1)`` + Reduce), and enters it.

Independent of TensorFlow: a model is a mapping of names to numpy arrays; the caller computes and
applies gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from elasticps.decentralized.peer_state import PeerState
from elasticps.decentralized.peers import Peers
from elasticps.decentralized.queues import Update
from elasticps.decentralized.rules import Skipping, reduce_weights, rejoin_point

G = TypeVar("G")
Model = dict[str, np.ndarray]
WAIT_SLICE_S = 1.0


class Stuck(RuntimeError):
    """The models of an iteration did not come within the wait's limit."""


@dataclass
class HopCounters:
    iterations: int = 0  # iterations run (minibatches)
    jumps: int = 0
    skipped: int = 0  # iteration numbers jumped over
    reduced: int = 0  # neighbours' models averaged in
    waited_s: float = 0.0  # in Recv
    tokens_s: float = 0.0  # waiting for tokens
    rejoined_at: int = -1  # a replacement: the iteration it went on from (-1: a fresh start)


class Hop(Generic[G]):
    def __init__(self, state: PeerState[Model], peers: Peers, skipping: Skipping, recv_limit_s: float = 600.0) -> None:
        self.state = state
        self.peers = peers
        self.skipping = skipping
        self.recv_limit_s = recv_limit_s
        self.counters = HopCounters()
        graph = state.graph
        self._own_weight = graph.weights[state.me][state.me]
        self._edge = {j: graph.weights[j][state.me] for j in graph.in_neighbours(state.me)}

    def step(self, model: Model, compute: Callable[[Model], G], apply: Callable[[Model, G], Model],
             slow: Callable[[float], object] = lambda busy_s: None) -> Model:
        """One iteration from ``model`` = ``x(k)``; returns the model the next iteration starts from.
        ``slow`` is told the seconds the iteration worked (not waited) before it enters the next."""
        k = self.state.iteration
        started, waited = time.monotonic(), self.counters.waited_s
        snapshot = {name: np.array(value, copy=True) for name, value in model.items()}
        self.state.sent(k, snapshot)
        self.peers.send(k, snapshot)
        gradient = compute(model)
        reduced = self._reduce(k, model)
        model = apply(reduced, gradient)
        slow(time.monotonic() - started - (self.counters.waited_s - waited))
        lags = self.peers.lags() if self.skipping.max_jump else []
        target = self.skipping.target(k, lags)
        began = time.monotonic()
        self.peers.take_tokens(target - k)
        self.counters.tokens_s += time.monotonic() - began
        if target > k + 1:
            self.counters.jumps += 1
            self.counters.skipped += target - k - 1
            self.peers.excuse(target - 1)
            model = self._reduce(target - 1, model)
        self.state.enter(target)
        self.counters.iterations += 1
        return model

    def rejoin(self) -> tuple[int, Model | None] | None:
        """At start: a worker replacing one that died or was removed goes on where it stopped (as its
        out-neighbours' tokens say), with the newest model a neighbour sent; None for a fresh start.
        The caller opens its Peer service to neighbours' models and tokens only afterwards."""
        point = rejoin_point(self.state.max_ig, self.peers.survey())
        if point is None:
            return None
        iteration, missing = point
        for worker, count in missing.items():
            self.peers.take_from(worker, count)
        self.state.rejoin(iteration, {})
        iterations = self.peers.announce_rejoin(iteration - 1)
        ins = set(self.state.graph.in_neighbours(self.state.me))
        self.state.rejoin(iteration, {j: it for j, it in iterations.items() if j in ins})
        newest = self.peers.pull_newest()
        self.counters.rejoined_at = iteration
        return iteration, None if newest is None else newest[1]

    def leave(self) -> None:
        """This worker's data ran out: its neighbours stop waiting for it."""
        self.state.leave()
        self.peers.excuse(0, left=True)

    def _reduce(self, iteration: int, model: Model) -> Model:
        got = self._collect(iteration)
        if not got:
            return model
        own, weights = reduce_weights(self.state.rule, iteration, self._own_weight,
                                      [(u.tag, self._edge[u.sender]) for u in got])
        self.counters.reduced += len(got)
        return average(model, own, [(w, u.payload) for w, u in zip(weights, got)])

    def _collect(self, iteration: int) -> list[Update[Model]]:
        began = time.monotonic()
        try:
            while True:
                got = self.state.collect(iteration, WAIT_SLICE_S)
                if got is not None:
                    return got
                self.peers.raise_sender_error()
                if time.monotonic() - began > self.recv_limit_s:
                    raise Stuck(f"worker {self.state.me}: the models of iteration {iteration} did not all come "
                                f"within {self.recv_limit_s:.0f} s")
        finally:
            self.counters.waited_s += time.monotonic() - began


def average(own: Mapping[str, np.ndarray], own_weight: float, others: list[tuple[float, Mapping[str, np.ndarray]]]) -> Model:
    """``own_weight * own + sum(w * other)``, tensor by tensor, in the own tensors' dtypes."""
    out: Model = {}
    for name, value in own.items():
        total = np.multiply(value, own_weight, dtype=np.float64) if value.dtype.kind == "f" else value.copy()
        if value.dtype.kind == "f":
            for weight, other in others:
                total += weight * other[name]
            out[name] = total.astype(value.dtype, copy=False)
        else:
            out[name] = total
    return out
