"""A shard's ``model_version``: the number of updates applied, and a way to wait for the next one.

Owned by the store (``store.py``), advanced only by the update rule (``rules.py``) once per applied
update, awaited by long-polling pulls (the servicer through ``ParameterStore.wait_newer``). Each
advance runs the store's hook (the checkpoint schedule) in the advancing thread, so a rule that
advances under its own lock (sync) has the hook see one consistent version. Listeners
(:meth:`ModelVersion.listen`: the servicer's long polls, which wait on an event loop, not on the
condition) hear of every change, in the changing thread: they must only schedule, never block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


# The highest version or incarnation a shard installs (a pushed model's, a restore's): 2^62 leaves an
# update a nanosecond for 146 years before the int64 on the wire could overflow.
MAX_VERSION = 1 << 62


def version_problem(field: str, value: int) -> str:
    """Why ``value`` cannot be a shard's ``field`` (a version or an incarnation); "" when it can."""
    if not 0 <= value <= MAX_VERSION:
        return f"{field} must be 0 to 2^62, got {value}"
    return ""


class ModelVersion:
    def __init__(self, on_advance: Callable[[int], None] | None = None) -> None:
        self._value = 0
        self._lock = threading.Lock()  # concurrent advances (async) each get their own number
        self._moved = threading.Condition()  # notified whenever the version changes
        self._on_advance = on_advance
        self._listeners: list[Callable[[], None]] = []

    def listen(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called after every change of the version (from the changing thread)."""
        self._listeners.append(listener)

    @property
    def value(self) -> int:
        return self._value

    def advance(self) -> int:
        """One update more: wakes waiting pulls, runs the hook; the new version."""
        with self._lock:
            self._value += 1
            new = self._value
        self._notify()
        if self._on_advance is not None:
            self._on_advance(new)
        return new

    def reset(self, version: int) -> None:
        """A model was installed at ``version`` (initialised, or restored from a checkpoint)."""
        with self._lock:
            self._value = version
        self._notify()

    def wait_newer(self, version: int, timeout_s: float) -> int:
        """Blocks until the version differs from ``version`` or ``timeout_s`` passes; the version."""
        with self._moved:
            self._moved.wait_for(lambda: self._value != version, timeout_s)
        return self._value

    def _notify(self) -> None:
        with self._moved:
            self._moved.notify_all()
        for listener in self._listeners:
            listener()
