"""A task queue with a hand-moved clock, for the queue's tests."""

from __future__ import annotations

from collections.abc import Mapping

from elasticps.coordinator.tasks.base import QueueSettings
from elasticps.coordinator.tasks.queue import TaskQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_queue(defaults: Mapping[str, object], **settings: object) -> tuple[TaskQueue, Clock]:
    """A queue of ``defaults`` overridden by ``settings`` (QueueSettings' fields), and its clock."""
    clock = Clock()
    return TaskQueue(QueueSettings(**{**defaults, **settings}), clock), clock  # type: ignore[arg-type]
