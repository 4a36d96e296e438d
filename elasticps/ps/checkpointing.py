"""When a shard writes checkpoints, and how it finds the one to resume from.

Callers: the store (``store.py``) hands :meth:`Checkpointing.after_update` every new version (the
version clock's hook, run by the update rule's thread) and calls :meth:`Checkpointing.restore` once
at start-up; ``ps/main.py`` flushes at shutdown. The file format is ``checkpoint.py``'s; this module
is the schedule around it:

* every ``checkpoint_steps`` versions a snapshot (copies) is taken in the updating thread (sync:
  under the rule's lock, so one version; async: of the live arrays) and written by one background
  writer thread, in order, keeping ``keep_checkpoint_max`` files;
* a restart loads the newest good checkpoint of this shard (``<checkpoint_dir>/ps-<shard>``),
  skipping corrupt ones, and rebuilds the model: each table from its own keys, the optimizer from
  the ``meta`` and its state from the ``opt/`` keys.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.model import Model
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.settings import StoreSettings
from elasticps.ps.tables import DenseTable

log = logging.getLogger(__name__)

_OPTIMIZER = "opt/"  # the optimizer's state keys in a checkpoint


def capture(model: Model, version: int, shard: int) -> checkpoint.Checkpoint:
    """Copies of the model's arrays, tables first (each in its namespace), then the optimizer's."""
    arrays = {}
    for table in model.tables.values():
        arrays.update(table.snapshot())
    arrays.update({f"{_OPTIMIZER}{key}": value.copy() for key, value in model.optimizer.state().items()})
    config = model.optimizer.config
    meta = {"shard": shard, "optimizer": {"name": config.name, "params": dict(config.params)}}
    return checkpoint.Checkpoint(version=version, arrays=arrays, meta=meta)


def rebuild(found: checkpoint.Checkpoint, shard: int) -> Model:
    """The model :func:`capture` saved: tables, optimizer and its state (OptimizerError if they differ)."""
    spec = found.meta.get("optimizer", {})
    config = OptimizerConfig(name=str(spec.get("name")), params=dict(spec.get("params", {})))
    model = Model(DenseTable.restored(found.arrays, shard), make_optimizer(config))
    model.optimizer.load_state(
        {key.removeprefix(_OPTIMIZER): value for key, value in found.arrays.items() if key.startswith(_OPTIMIZER)}
    )
    return model


class Checkpointing:
    """One shard's checkpoint schedule and its single writer thread."""

    def __init__(self, directory: Path | None, every: int = 0, keep: int = 3, shard: int = 0) -> None:
        self.directory = directory
        self.every = every
        self.keep = keep
        self.shard = shard
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")

    @classmethod
    def for_shard(cls, settings: StoreSettings) -> Checkpointing:
        directory = None if settings.checkpoint_dir is None else settings.checkpoint_dir / f"ps-{settings.shard}"
        return cls(directory, settings.checkpoint_steps, settings.keep_checkpoint_max, settings.shard)

    def due(self, version: int) -> bool:
        return self.directory is not None and self.every > 0 and version % self.every == 0

    def after_update(self, version: int, snapshot: Callable[[], checkpoint.Checkpoint]) -> None:
        """Takes a snapshot now and queues its write when ``version`` is due for one."""
        if self.due(version):
            self._writer.submit(self._write, snapshot())

    def flush(self) -> None:
        """Waits for the checkpoints already queued (tests; shutdown)."""
        self._writer.submit(lambda: None).result()

    def restore(self) -> tuple[Model, int] | None:
        """The model and version of the newest good checkpoint, if any; corrupt ones are skipped."""
        if self.directory is None:
            return None
        found = checkpoint.load_latest(self.directory)
        if found is None:
            return None
        return rebuild(found, self.shard), found.version

    def _write(self, snapshot: checkpoint.Checkpoint) -> None:
        assert self.directory is not None  # due() said so
        try:
            path = checkpoint.save(self.directory, snapshot, keep=self.keep)
            log.info("checkpoint of version %d written to %s", snapshot.version, path)
        except OSError as err:
            log.error("checkpoint of version %d failed: %s", snapshot.version, err)
