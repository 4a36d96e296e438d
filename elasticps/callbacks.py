"""What a model module's ``callbacks()`` may give: the callbacks that mean something on a PS.

ElasticDL's zoo schedules the learning rate by model version in ``callbacks()``
(``return [LearningRateScheduler(schedule)]``, ``schedule(model_version) -> lr``); here the same
class, so such a module changes its import line only:

    from elasticdl.python.elasticdl.callbacks import LearningRateScheduler   # ElasticDL
    from elasticps.callbacks import LearningRateScheduler                    # elasticps

A worker asks the schedule for the learning rate of the model version each gradient was computed
on and sends it with the gradient; the PS applies the gradient at that rate (sync: the round's, all
members at one version), so the rate follows the version on every shard. The rate the PS applied
last is its ``elasticps_ps_learning_rate`` metric and the ``train/learning_rate`` curve in
TensorBoard. Other callbacks (Keras's, ElasticDL's exporters and stoppers) act on a model fitted in
one process and have no counterpart here: a module giving one is refused in one line
(``backends/keras/model_loading.py``).

Standard library only: the PS imports the ``elasticps`` package too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["LearningRateScheduler", "ScheduleError"]


class ScheduleError(ValueError):
    """A schedule that gave no usable learning rate: a user's mistake, said in one line."""


class LearningRateScheduler:
    """``schedule(model_version) -> learning rate``, for every gradient of that version.

    ``model_version`` counts the PS's updates: rounds in a sync job, pushes in an async one."""

    def __init__(self, schedule: Callable[[int], float]) -> None:
        if not callable(schedule):
            raise ScheduleError(f"LearningRateScheduler({schedule!r}): the schedule must be a function of the model version")
        self.schedule = schedule

    def learning_rate(self, version: int) -> float:
        """The schedule's rate at ``version`` (>= 0), checked: a finite number > 0."""
        value = self.schedule(max(0, version))
        try:
            rate = float(value)
        except (TypeError, ValueError):
            rate = math.nan
        if not (math.isfinite(rate) and rate > 0):
            raise ScheduleError(f"the learning-rate schedule gave {value!r} at model version {version}: "
                                "a learning rate is a finite number > 0")
        return rate
