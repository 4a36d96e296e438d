"""The coordinator's ledger saved at checkpointed versions (sync jobs), next to the shards' checkpoints.

Written by the coordinator (``syncing.py``) when a round makes a version the shards checkpoint
(``checkpointSteps``), read back by the recovery (``recovery.py``, ``watching.py``) to roll the ledger back together
with the shards. One JSON file per version, ``<dir>/ledger-<version>.json``, written atomically and
fsynced; the newest ``keep`` are kept, and the one of the newest version every shard can restore.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from elasticps.files import write_atomically

log = logging.getLogger(__name__)

_NAME = re.compile(r"ledger-(\d{12})\.json")


class Journals:
    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = max(1, keep)

    def path(self, version: int) -> Path:
        return self.directory / f"ledger-{version:012d}.json"

    def versions(self) -> list[int]:
        """The versions a ledger was saved at, newest first."""
        try:
            names = [p.name for p in self.directory.iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = [int(m.group(1)) for m in map(_NAME.fullmatch, names) if m]
        return sorted(found, reverse=True)

    def write(self, version: int, state: dict[str, Any], protect: int = 0) -> None:
        """Saves the ledger at ``version``; keeps the newest ``keep`` and the one of ``protect``
        (the newest version every shard can restore too; 0: none)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(version), json.dumps(state))
        for old in self.versions()[self.keep :]:
            if old != protect:
                self.path(old).unlink(missing_ok=True)

    def discard_after(self, version: int) -> None:
        """Removes the ledgers of versions after ``version`` (a rollback abandoned them)."""
        for later in self.versions():
            if later > version:
                self.path(later).unlink(missing_ok=True)

    def read(self, version: int) -> dict[str, Any]:
        """The ledger saved at ``version`` (OSError, ValueError if it is missing or unreadable)."""
        state = json.loads(self.path(version).read_text())
        if not isinstance(state, dict):
            raise ValueError(f"{self.path(version)} holds no ledger")
        return state
