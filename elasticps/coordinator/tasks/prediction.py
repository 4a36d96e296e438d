"""Prediction tasks (``prediction_records``, ``spec.prediction``): the prediction data, cut once.

Once the final export is done (or the final evaluation, without an output) and the shards hold one
version (``settled``), the prediction data is cut into tasks of ``records_per_task`` records, in
record order, all carrying that version; a job without training data (``num_records`` 0: it
predicts with an exported model) cuts them at once, with no version. Each is counted once, by its
first record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elasticps.coordinator.tasks.base import Ids, QueueSettings, Task, TaskKind


class Predictions:
    def __init__(self, settings: QueueSettings, ids: Ids) -> None:
        self._s = settings
        self._ids = ids
        self.todo: list[Task] = []
        self._version: int | None = None  # set when the prediction tasks are cut
        self._predicted: set[int] = set()  # first records of the prediction tasks reported

    def due(self, before_done: bool) -> bool:
        """The tasks are still to cut and everything before them is done (``before_done``)."""
        return self._s.prediction_records > 0 and self._version is None and before_done

    def start(self, due: bool, settled: int | None, exported: tuple[int, bool] | None) -> Task | None:
        """Cuts the tasks once their turn came (``due``): after training, with the ``settled``
        version (the final export's when there was one: the model does not move any more)."""
        if not due:
            return None
        if self._s.trains:
            if settled is None:
                return None
            version = exported[0] if exported is not None and exported[1] else settled
        else:
            version = 0
        self._cut(version)
        return self.todo.pop(0) if self.todo else None

    def record(self, task: Task) -> None:
        self._predicted.add(task.start)

    @property
    def records_predicted(self) -> int:
        size, total = self._s.records_per_task, self._s.prediction_records
        return sum(min(total, start + size) - start for start in self._predicted)

    @property
    def done(self) -> bool:
        return self.records_predicted == self._s.prediction_records

    def _cut(self, version: int) -> None:
        self._version = version
        tasks = self._ids.cut(self._s.prediction_records, TaskKind.PREDICTION, epoch=0, version=version)
        self.todo = [t for t in tasks if t.start not in self._predicted]

    # ---- the ledger ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"prediction_version": self._version, "predicted": sorted(self._predicted)}

    def restore(self, state: Mapping[str, Any]) -> None:
        """The tasks not reported are cut again, for the version they were cut for."""
        version = state.get("prediction_version")
        self._version = None if version is None else int(version)
        self._predicted = {int(start) for start in state.get("predicted", [])}
        self.todo = []
        if self._version is not None:
            self._cut(self._version)
