"""Stragglers on purpose (``spec.training.slowdown``): which workers compute slower, and how much. Pure.

For experiments and tests of the heterogeneity modes: the same job, the same slowdowns, every mode
(seeds 003 and 004). A worker realises its factor by sleeping, after computing each minibatch's
gradients, ``factor - 1`` times as long as the computation took (``worker/local_model.py``; a
decentralized worker, which also averages its neighbours' models itself, after its whole
iteration's work: ``worker/peer_model.py``), so it works the same in a pod and in a local process, on any machine speed.

The text is a comma-separated list of:

* ``<worker>:<factor>``: that worker (its ``--worker_id``) is always ``factor`` times slower
  (``0:4``: worker 0 four times slower);
* ``random:<factor>:<probability>``: every worker, at every step, is ``factor`` times slower with
  that probability (Hop's protocol for n workers is ``random:6:<1/n>``).

Both may be given; a worker with a fixed factor that draws a random one takes the larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

MAX_FACTOR = 1000.0


class SlowdownError(ValueError):
    """A slowdown text that does not parse; the message says which part and why."""


@dataclass(frozen=True)
class Slowdown:
    fixed: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    random_factor: float = 1.0
    random_probability: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Slowdown:
        fixed: dict[int, float] = {}
        random_factor, probability = 1.0, 0.0
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            words = part.split(":")
            if words[0] == "random":
                if len(words) != 3:
                    raise SlowdownError(f"{part!r}: expected random:<factor>:<probability>")
                random_factor = _factor(part, words[1])
                probability = _number(part, words[2], "probability")
                if not 0.0 <= probability <= 1.0:
                    raise SlowdownError(f"{part!r}: the probability must be in [0, 1], got {words[2]}")
                continue
            if len(words) != 2 or not words[0].isdigit():
                raise SlowdownError(f"{part!r}: expected <worker>:<factor> or random:<factor>:<probability>")
            worker = int(words[0])
            if worker in fixed:
                raise SlowdownError(f"{part!r}: worker {worker} is named twice")
            fixed[worker] = _factor(part, words[1])
        return cls(MappingProxyType(fixed), random_factor, probability)

    @property
    def active(self) -> bool:
        return any(f > 1.0 for f in self.fixed.values()) or (self.random_factor > 1.0 and self.random_probability > 0)

    def factor(self, worker: int, draw: float) -> float:
        """Worker ``worker``'s factor for one step; ``draw``: a uniform number in [0, 1) for it."""
        factor = self.fixed.get(worker, 1.0)
        if draw < self.random_probability:
            factor = max(factor, self.random_factor)
        return factor


def _number(part: str, word: str, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise SlowdownError(f"{part!r}: the {what} {word!r} is not a number") from None
    if not math.isfinite(value):
        raise SlowdownError(f"{part!r}: the {what} must be finite, got {word}")
    return value


def _factor(part: str, word: str) -> float:
    value = _number(part, word, "factor")
    if not 1.0 <= value <= MAX_FACTOR:
        raise SlowdownError(f"{part!r}: the factor must be in [1, {MAX_FACTOR:g}], got {word}")
    return value


def slowdown_problem(text: str) -> str | None:
    """Why ``text`` is not a slowdown (one line), or None: the spec field's check."""
    try:
        Slowdown.parse(text)
    except SlowdownError as err:
        return str(err)
    return None
