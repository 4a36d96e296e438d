"""Export tasks (a job with ``spec.output``): the final model, and with ``export_steps`` periodic ones.

Once every training task and the final evaluation are done and every PS shard holds the same
version (the caller passes that ``settled`` version), one export task of exactly that version is
handed to the next worker that asks. With ``export_steps`` a periodic export is also queued each
time the model crosses a multiple of it (one at a time, handed before training tasks, like
evaluations). An export whose worker reports that the output refused it (``export_failed``: a
missing bucket, a path under a file, no credentials) goes back to todo like any failed task, but it
counts: after ``export_attempts`` such failures the queue gives up on the job (:attr:`failure`
says which export, the last error, and how many attempts). A worker that dies or is stopped while
exporting does not count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elasticps.coordinator.tasks.base import ExportFailure, Ids, QueueSettings, Task, TaskKind


class Exports:
    def __init__(self, settings: QueueSettings, ids: Ids) -> None:
        self._s = settings
        self._ids = ids
        self.todo: list[Task] = []
        self._pending = False  # a periodic export is queued or being written
        self._last_trigger = 0
        self._final_started = False
        self.final_done = not (settings.export and settings.trains)  # nothing trained, nothing to export
        self.exported: tuple[int, bool] | None = None  # (version, final) of the newest export done
        self._failures: dict[int, int] = {}  # export task id -> attempts the output refused
        self.failure: ExportFailure | None = None

    def awaiting_final(self, evaluated: bool) -> bool:
        """Whether the final export is still to hand out once training and the final evaluation
        are done (``evaluated``): the next task then needs the ``settled`` version."""
        return self._s.export and self._s.trains and not self._final_started and evaluated

    def on_version(self, model_version: int, training_done: bool, epoch: int) -> None:
        """Queues a periodic export when the model crossed a multiple of ``export_steps``."""
        steps = self._s.export_steps
        if not self._s.export or not steps or self._pending or training_done:
            return  # the final export covers the end of training
        if model_version // steps > self._last_trigger // steps:
            self._last_trigger = model_version
            self._pending = True
            self.todo.append(Task(self._ids.take(), TaskKind.EXPORT, 0, 0, max(0, epoch), model_version))

    def final(self, awaiting: bool, settled: int | None, epoch: int) -> Task | None:
        """The final export of the ``settled`` version, when it is ``awaiting`` and there is one."""
        if not awaiting or settled is None:
            return None
        self._final_started = True
        return Task(self._ids.take(), TaskKind.EXPORT, 0, 0, max(0, epoch), settled, final=True)

    def record(self, task: Task, written: int) -> None:
        version = written if written > 0 else task.model_version
        if task.final:
            self.final_done = True
        else:
            self._pending = False
        if self.exported is None or task.final or not self.exported[1]:
            self.exported = (version, task.final)

    def count_failure(self, task: Task, error: str) -> None:
        attempts = self._failures.get(task.id, 0) + 1
        self._failures[task.id] = attempts
        if attempts >= self._s.export_attempts:
            self.failure = ExportFailure(task.model_version, task.final, attempts, error)

    # ---- the ledger ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "last_export_trigger": self._last_trigger,
            "final_export_done": self.final_done,
            "exported": None if self.exported is None else list(self.exported),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        # Ledgers saved before exports existed lack these keys: nothing was exported then.
        self._last_trigger = int(state.get("last_export_trigger", 0))
        self.final_done = bool(state.get("final_export_done", False)) or not (self._s.export and self._s.trains)
        exported = state.get("exported")
        self.exported = None if not exported else (int(exported[0]), bool(exported[1]))
