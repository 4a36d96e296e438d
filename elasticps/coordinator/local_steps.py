"""LocalSGD's period: how many local steps each worker takes before the next averaging. Pure.

PS 0's coordinator holds one :class:`LocalSteps` beside its rounds (``rounds.py``) and decides the
period once per committed round, for every worker alike: each worker reads it in the answer to its
join (``JoinReply.local_steps``), so all of them average after the same number of steps, and a
worker that joins mid-job takes the others' period from its first round on.

* **Fixed K with warm-up** (seed 003's ``get_local_sgd_steps``, counted in local steps rather than
  passes, so that a job of a few epochs reaches its K): K = 1 for the first ``warmup_steps`` steps;
  then 1, 2, 4, ... (the powers of two up to K), each for ``warmup_steps`` steps; then K. Without a
  warm-up, K from the first round on.
* **Adaptive K** (seed 003's ``adaptive_local_step``, after Wang and Joshi's AdaComm): after round
  ``l`` (past the warm-up), ``K_l = int(K0 * sqrt(lr_0 (F_l - F_inf) / (lr_l * max(F_0 - F_inf,
  1e-12))))``, at least 1, where ``F_l`` is the round's training loss averaged over its members,
  ``lr_l`` their learning rate, ``F_0`` and ``lr_0`` those of the first round, ``F_inf`` the job's
  ``localSGDInfLoss``; a loss below ``F_inf`` counts as ``F_inf`` (K = 1, not an error), and a K more
  than 20 above the previous one keeps the previous one (the seed's guard against a jump).

The steps counted are the periods of the committed rounds (a round of members whose tasks ended
early counts the longest of their periods). A restarted coordinator starts the schedule again.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from elasticps.api.modes import LocalSGD

MAX_JUMP = 20  # seed 003: a K this much above the previous one keeps the previous one
MIN_LOSS_GAP = 1e-12
_REMEMBERED = 64  # rounds whose decision a late join may still ask for


def warmup_period(done: int, steps: int, warmup_steps: int) -> int:
    """The fixed schedule's K for a period that starts after ``done`` local steps."""
    if warmup_steps <= 0:
        return steps
    if done < warmup_steps:
        return 1
    levels = [2**i for i in range(steps.bit_length()) if 2**i <= steps]
    level = (done - warmup_steps) // warmup_steps
    return steps if level >= len(levels) else levels[level]


def adaptive_period(
    k0: int, first_loss: float, first_lr: float, loss: float, lr: float, inf_loss: float, previous: int
) -> int:
    """AdaComm's K after a round of training loss ``loss`` at learning rate ``lr``."""
    if not (lr > 0 and first_lr > 0 and all(map(math.isfinite, (first_loss, loss, inf_loss)))):
        return previous
    denominator = lr * max(first_loss - inf_loss, MIN_LOSS_GAP)
    if denominator <= 0:  # underflowed (lr 5e-324): a ratio beyond any bound, as below
        return previous
    root = k0 * math.sqrt(first_lr * max(loss - inf_loss, 0.0) / denominator)
    if not math.isfinite(root):  # loss 1e200 at lr 1e-300: a jump beyond any bound
        return previous
    period = max(1, int(root))
    return previous if period > previous + MAX_JUMP else period


@dataclass
class LocalSteps:
    """The schedule of one job; :meth:`committed` after every round, in order."""

    settings: LocalSGD
    done: int = 0  # local steps per worker over the committed rounds
    current: int = 0  # the period of the next round
    first: tuple[float, float] | None = None  # (loss, learning rate) of the first round
    adapting: bool = False  # past the warm-up: K follows the loss
    _decided: OrderedDict[int, int] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.settings.steps < 1:
            raise ValueError(f"LocalSGD needs localSGDSteps >= 1, got {self.settings.steps}")
        self.current = self._fixed()

    def _fixed(self) -> int:
        return warmup_period(self.done, self.settings.steps, self.settings.warmup_steps)

    def committed(self, round_: int, period: int, loss: float, learning_rate: float) -> int:
        """Round ``round_`` averaged periods of at most ``period`` local steps, whose training loss
        was ``loss`` (averaged over the members) at ``learning_rate``: the next round's period."""
        self.done += max(1, period)
        settings = self.settings
        if settings.adaptive:
            if self.first is None:
                self.first = (loss, learning_rate)
            if self.done < settings.warmup_steps:
                self.current = 1
            else:
                first_loss, first_lr = self.first
                previous = self.current if self.adapting else settings.steps  # the warm-up's 1 is no guide
                self.adapting = True
                self.current = adaptive_period(
                    settings.steps, first_loss, first_lr, loss, learning_rate, settings.inf_loss, previous
                )
        else:
            self.current = self._fixed()
        self._decided[round_] = self.current
        while len(self._decided) > _REMEMBERED:
            self._decided.popitem(last=False)
        return self.current

    def after(self, round_: int) -> int:
        """The period decided when round ``round_`` was committed (the current one once forgotten)."""
        return self._decided.get(round_, self.current)
