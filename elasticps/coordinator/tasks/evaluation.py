"""Evaluation tasks: every ``evaluation_steps`` model versions, and once after the last training task.

The validation data is cut into evaluation tasks, handed out before training tasks; their metric
sums are aggregated into one result per evaluated version (one evaluation at a time). The final
evaluation is skipped when the last periodic one already saw the model training ended on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticps.coordinator.tasks.base import Ids, QueueSettings, Task, TaskKind


@dataclass
class _Evaluation:
    version: int
    pending: int
    records: int = 0
    sums: dict[str, float] = field(default_factory=dict)


class Evaluations:
    def __init__(self, settings: QueueSettings, ids: Ids) -> None:
        self._s = settings
        self._ids = ids
        self.todo: list[Task] = []
        self._current: _Evaluation | None = None
        self._last_trigger = 0
        self._final_started = False
        self.final_done = settings.validation_records == 0
        self.metrics: dict[str, float] = {}
        self.metrics_version = -1
        self.completed = 0  # evaluations completed since this queue started

    @property
    def running(self) -> bool:
        """An evaluation is cut and not every one of its tasks is reported."""
        return self._current is not None

    def on_version(self, model_version: int) -> None:
        """Starts an evaluation when the model crossed a multiple of ``evaluation_steps``."""
        steps = self._s.evaluation_steps
        if not steps or not self._s.validation_records or self._current is not None:
            return
        if model_version // steps > self._last_trigger // steps:
            self._last_trigger = model_version
            self._start(model_version)

    def final(self, training_done: bool, model_version: int) -> Task | None:
        """After training: the final evaluation's first task, unless the last periodic evaluation
        saw this very model (then the final one is done at once)."""
        if not training_done or self._final_started or self._current is not None:
            return None
        if self._s.validation_records and self.metrics_version == model_version:
            self.final_done = True
        elif self._s.validation_records:
            self._final_started = True
            self._start(model_version)
            return self.todo.pop(0)
        return None

    def record(self, task: Task, sums: Mapping[str, float]) -> None:
        evaluation = self._current
        if evaluation is None:
            return
        evaluation.pending -= 1
        evaluation.records += task.records
        for name, value in sums.items():
            evaluation.sums[name] = evaluation.sums.get(name, 0.0) + value
        if evaluation.pending == 0:
            self.metrics = {n: v / max(1, evaluation.records) for n, v in evaluation.sums.items()}
            self.metrics_version = evaluation.version
            self.completed += 1
            self._current = None
            if self._final_started:
                self.final_done = True

    def _start(self, version: int) -> None:
        tasks = self._ids.cut(self._s.validation_records, TaskKind.EVALUATION, epoch=0, version=version)
        self._current = _Evaluation(version=version, pending=len(tasks))
        self.todo.extend(tasks)

    # ---- the ledger ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "metrics": dict(self.metrics),
            "metrics_version": self.metrics_version,
            "last_eval_trigger": self._last_trigger,
            "final_eval_done": self.final_done,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.metrics = {str(k): float(v) for k, v in state["metrics"].items()}
        self.metrics_version = int(state["metrics_version"])
        self._last_trigger = int(state["last_eval_trigger"])
        self.final_done = bool(state["final_eval_done"])
