"""When a shard writes checkpoints, and how it finds the one to resume from.

Callers: the store (``store.py``) hands :meth:`Checkpointing.after_update` every new version (the
version clock's hook, run by the update rule's thread) and calls :meth:`Checkpointing.restore` once
at start-up; ``ps/main.py`` flushes at shutdown. The file format is ``checkpoint.py``'s; this module
is the schedule around it:

* every ``checkpoint_steps`` versions a snapshot (copies) is taken in the updating thread (sync:
  under the rule's lock, so one version; async: of the live arrays) and written by one background
  writer thread, in version order, keeping ``keep_checkpoint_max`` files and the newest version
  the whole job can restore (the coordinator names it with each commit: ``protected``);
* the writer never falls behind without bound: at most one snapshot waits behind the one being
  written, and a newer snapshot replaces a waiting older one (that version is skipped on disk). So
  a shard holds at most two snapshots, however slow the disk, and the push path never waits for
  a write; the newest due version is always the one written last.
* incremental (``checkpoint_full_every`` N > 1, issue 38): one snapshot in N is whole, the N - 1
  after it deltas of it (:func:`capture` with a :class:`Base`): the dense and state tables and the
  optimizer whole, each table of rows only its rows used since the whole one and the ids evicted
  since (differential, not chained: any delta and its base make the model whole, :func:`whole`,
  whichever deltas were skipped or lost). A whole one counts only once written; a rollback or
  restore makes the next one whole (the tables' eviction logs start afresh). A delta is
  restorable only with its base (:meth:`Checkpointing.versions`), and retention keeps the bases
  of the kept deltas and of the version the job can restore;
* a restart loads the newest good checkpoint of this shard (``<checkpoint_dir>/ps-<shard>``),
  skipping corrupt ones, and rebuilds the model: each table from its own keys, the optimizer from
  the ``meta`` and its state from the ``opt/`` keys. The model's non-trainable state is a table
  (``state/`` keys); ``meta["state_table"]`` says the checkpoint was written with one, so a
  checkpoint written before shards kept state (no such entry) restores with a table that adopts
  the state the workers push next (``state_table.py``). Embedding tables are saved whole, every row
  held with its slots and count (``emb/<name>/`` keys), their specs and the job's shard count in
  ``meta["tables"]`` and ``meta["shards"]``. Each table comes back through its kind's entry in
  ``kinds.py``: the dense and state tables always, each declared table by the ``kind`` its spec
  was saved with (a spec saved before kinds has none: an embedding table).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticps.api.embedding import EmbeddingError, TableSpec
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.row_policy import RowPolicies
from elasticps.api.table_kinds import TableKind
from elasticps.ps import checkpoint
from elasticps.ps.kinds import KINDS, Restoring
from elasticps.ps.model import Model
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.checkpoint_deltas import PREFIX, base_of, load_whole, whole
from elasticps.ps.settings import StoreSettings
from elasticps.ps.tables import RowTable, Table

log = logging.getLogger(__name__)

_OPTIMIZER = "opt/"  # the optimizer's state keys in a checkpoint


@dataclass(frozen=True)
class Base:
    """A whole checkpoint on disk that later ones may be deltas of: its version and each table of
    rows' clock then (by table name)."""

    version: int
    clocks: Mapping[str, int]


def capture(model: Model, version: int, shard: int, base: Base | None = None, deltas: bool = False) -> checkpoint.Checkpoint:
    """Copies of the model's arrays, tables first (each in its namespace), then the optimizer's;
    with ``base``, each table of rows only as its delta since that whole checkpoint (the dense and
    state tables and the optimizer are always whole). ``deltas``: deltas will follow this one
    (the tables start keeping their evictions, if they did not). ``meta["clocks"]``: each table
    of rows' clock; ``meta["delta_of"]``: the base's version, in a delta."""
    arrays = {}
    rows = model.embeddings
    if deltas:
        for row_table in rows.values():
            row_table.log_evictions()
    for table in model.tables.values():
        if base is not None and isinstance(table, RowTable):
            arrays.update(table.delta(base.clocks.get(table.spec.name, 0)))
        else:
            arrays.update(table.snapshot())
    arrays.update({f"{_OPTIMIZER}{key}": value.copy() for key, value in model.optimizer.state().items()})
    config = model.optimizer.config
    meta = {"shard": shard, "optimizer": {"name": config.name, "params": dict(config.params)}, "state_table": True}
    tables = list(rows.values())
    if tables:
        meta["tables"] = [spec_meta(table.spec) for table in tables]
        meta["shards"] = tables[0].shards
        meta["clocks"] = {name: table.clock for name, table in rows.items()}
    if base is not None:
        meta["delta_of"] = base.version
    return checkpoint.Checkpoint(version=version, arrays=arrays, meta=meta)


def spec_meta(spec: TableSpec) -> dict[str, Any]:
    """A declared table's spec as a checkpoint's meta records it, its kind by name."""
    return {**dataclasses.asdict(spec), "kind": spec.kind.value}


def spec_from_meta(saved: Mapping[str, Any]) -> TableSpec:
    """The spec :func:`spec_meta` recorded; one without ``kind`` (saved before kinds) is an
    embedding table's. EmbeddingError names an unknown kind; TypeError an unknown field."""
    return TableSpec(**{**saved, "kind": str(saved.get("kind", "") or "")})


def rebuild(found: checkpoint.Checkpoint, shard: int, policies: RowPolicies = RowPolicies()) -> Model:
    """The model :func:`capture` saved: tables, optimizer and its state (OptimizerError if they
    differ); its tables of rows keep what ``policies`` say."""
    spec = found.meta.get("optimizer", {})
    config = OptimizerConfig(name=str(spec.get("name")), params=dict(spec.get("params", {})))
    optimizer = make_optimizer(config)
    tables: dict[str, Table[Any]] = {}
    for kind in (TableKind.DENSE, TableKind.STATE):  # implicit in every model
        tables[KINDS[kind].key(None)] = KINDS[kind].restore(Restoring(shard, 1, optimizer, found.arrays, found.meta))
    try:
        specs = [spec_from_meta(spec) for spec in found.meta.get("tables", [])]
        shards = int(found.meta.get("shards", 1))
        for spec in specs:  # each by the kind it was saved with
            saved = Restoring(shard, shards, optimizer, found.arrays, found.meta, spec, policies.of(spec.name))
            tables[KINDS[spec.kind].key(spec)] = KINDS[spec.kind].restore(saved)
    except (EmbeddingError, TypeError, ValueError) as err:
        raise checkpoint.CheckpointError("-", f"its declared tables cannot be restored: {err}") from None
    model = Model.of(tables, optimizer)
    model.optimizer.load_state(
        {key.removeprefix(_OPTIMIZER): value for key, value in found.arrays.items() if key.startswith(_OPTIMIZER)}
    )
    return model


class Checkpointing:
    """One shard's checkpoint schedule and its single writer thread (started on the first due version)."""

    def __init__(self, directory: Path | None, every: int = 0, keep: int = 3, shard: int = 0,
                 policies: RowPolicies = RowPolicies(), full_every: int = 0) -> None:
        self.directory = directory
        self.every = every
        self.keep = keep
        self.shard = shard
        self.policies = policies
        self.full_every = full_every  # > 1: one whole checkpoint in this many, deltas of it between
        self._base: Base | None = None  # the newest whole checkpoint written by this process
        self._deltas = 0  # deltas of it written since
        # Told each table of rows' clock once a whole checkpoint is written (the store forgets evictions before it).
        self.on_full: Callable[[Mapping[str, int]], None] = lambda clocks: None
        self._lock = threading.Condition()
        self._waiting: checkpoint.Checkpoint | None = None  # the next one to write; newer replaces it
        self._busy = False  # the writer is writing one now
        self._handed = -1  # the newest version handed to the writer: an older one is never written after it
        self._thread: threading.Thread | None = None
        self.skipped = 0  # snapshots replaced before they were written
        self.failure = ""  # why the latest write failed ("": it did not; a later good write clears it)
        # The newest version every shard and the ledger can restore (0: none known): kept past ``keep``.
        self.protected = 0
        # Each file's verdict, by name, while its size and mtime stay: None (it reads back whole) or
        # why not, and the whole checkpoint it is a delta of (None: it is whole, or unread).
        self._verdicts: dict[str, tuple[tuple[int, int], str | None, int | None]] = {}
        self._examining = threading.Lock()

    @classmethod
    def for_shard(cls, settings: StoreSettings) -> Checkpointing:
        directory = None if settings.checkpoint_dir is None else settings.checkpoint_dir / f"ps-{settings.shard}"
        return cls(directory, settings.checkpoint_steps, settings.keep_checkpoint_max, settings.shard,
                   settings.row_policies, settings.checkpoint_full_every)

    def due(self, version: int) -> bool:
        return self.directory is not None and self.every > 0 and version % self.every == 0

    def plan(self) -> Base | None:
        """The whole checkpoint the next snapshot is a delta of; None: the next is whole (deltas
        are off, none is written yet, or the last whole one has its ``full_every - 1`` deltas)."""
        with self._lock:
            if self.full_every <= 1 or self._base is None or self._deltas >= self.full_every - 1:
                return None
            return self._base

    def after_update(self, version: int, snapshot: Callable[[Base | None], checkpoint.Checkpoint]) -> None:
        """Takes a snapshot now when ``version`` is due (whole, or a delta of the last whole one:
        :meth:`plan`) and hands it to the writer; never waits for disk."""
        if not self.due(version):
            return
        with self._lock:
            if self._waiting is not None:
                # Dropped before the new copy is taken, so a shard never holds a third snapshot.
                self._waiting = None
                self.skipped += 1
        self._hand(snapshot(self.plan()))

    def final(self, version: int, snapshot: Callable[[Base | None], checkpoint.Checkpoint]) -> None:
        """The shard stops at ``version``: a checkpoint of it too, due or not (none twice), so that a
        job stopped as a whole (suspended, evicted by its queue) resumes where it stopped, not at
        its last due version. :meth:`flush` waits for it."""
        if self.directory is None or self.every <= 0 or version <= 0:
            return
        with self._lock:
            if version <= self._handed:
                return
        self._hand(snapshot(self.plan()))

    def _hand(self, taken: checkpoint.Checkpoint) -> None:
        with self._lock:
            if taken.version <= self._handed:
                # Async updates may snapshot concurrently: a newer version got here first.
                self.skipped += 1
                return
            if self._waiting is not None:
                self.skipped += 1
            self._waiting, self._handed = taken, taken.version
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"checkpoint-{self.shard}", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def flush(self) -> None:
        """Waits until the snapshots handed over so far are on disk (tests; shutdown)."""
        with self._lock:
            self._lock.wait_for(lambda: self._waiting is None and not self._busy)

    def restore(self) -> tuple[Model, int] | None:
        """The model and version of the newest good checkpoint, if any. Corrupt files are skipped,
        and so is a file that verifies but whose contents do not make a model (tables or optimizer
        state that do not fit together: another program's, or edited), each with a warning naming
        it and why, for the next older one."""
        if self.directory is None:
            return None
        unusable = 0
        for found in checkpoint.verified(self.directory):  # corrupt files skipped there
            try:
                return rebuild(self._whole(found), self.shard, self.policies), found.version
            except (checkpoint.CheckpointError, ValueError, TypeError, KeyError) as err:  # OptimizerError is a ValueError
                unusable += 1
                path = checkpoint.path_of(self.directory, found.version)
                log.warning("shard %d: skipping checkpoint %s: its model cannot be rebuilt: %s", self.shard, path, err)
        if unusable:
            log.warning("shard %d: no checkpoint in %s can be restored", self.shard, self.directory)
        return None

    def rolled_back(self, version: int) -> None:
        """The shard went back to ``version`` (a new incarnation): the snapshot waiting for the writer
        and the files of later versions are of the abandoned model, and those versions will be
        reached, and written, again."""
        with self._lock:
            if self._waiting is not None:
                self._waiting = None
                self.skipped += 1
            self._handed = version
            self._lock.wait_for(lambda: not self._busy)
            self._base, self._deltas = None, 0  # the tables' eviction logs are the new model's: a whole one next
            if self.directory is not None:
                for path in checkpoint.list_checkpoints(self.directory):
                    found = checkpoint.version_of(path)
                    if found is not None and found > version:
                        path.unlink(missing_ok=True)

    def versions(self) -> list[int]:
        """The versions this shard has checkpoints of that read back whole (a delta: its whole
        base too), newest first: the ones a restore can use (``recovery.py`` picks among them)."""
        found = self.examined()
        good = {version for version, why in found if why is None}
        return [version for version, why in found if why is None and self._base_version(version) in good | {None}]

    def unreadable(self) -> list[str]:
        """This shard's checkpoint files that do not read back, each as ``<file>: <why>``."""
        if self.directory is None:
            return []
        out = []
        found = self.examined()
        good = {version for version, why in found if why is None}
        for version, why in found:
            base = self._base_version(version)
            if why is None and base is not None and base not in good:
                why = f"a delta of version {base}, which does not read back"
            if why is not None:
                out.append(f"{checkpoint.path_of(self.directory, version)}: {why}")
        return out

    def _base_version(self, version: int) -> int | None:
        """The whole checkpoint the file of ``version`` is a delta of (as its verdict found), None for a whole one."""
        assert self.directory is not None
        known = self._verdicts.get(checkpoint.path_of(self.directory, version).name)
        return None if known is None else known[2]

    def examined(self) -> list[tuple[int, str | None]]:
        """Every checkpoint file's version and verdict (None: it verifies), newest first. A file
        is read through once (``checkpoint.verify``); its verdict is kept while its size and
        modification time stay."""
        if self.directory is None:
            return []
        with self._examining:  # DescribeShard calls come from the server's pool
            return self._examine(self.directory)

    def _examine(self, directory: Path) -> list[tuple[int, str | None]]:
        out: list[tuple[int, str | None]] = []
        seen: set[str] = set()
        for path in checkpoint.list_checkpoints(directory):
            version = checkpoint.version_of(path)
            if version is None:
                continue
            try:
                stat = path.stat()
            except OSError:
                continue  # deleted meanwhile (retention)
            stamp = (stat.st_size, stat.st_mtime_ns)
            known = self._verdicts.get(path.name)
            if known is None or known[0] != stamp:
                try:
                    known = (stamp, None, base_of(checkpoint.verify(path)))
                except checkpoint.CheckpointError as err:
                    known = (stamp, err.reason, None)
                self._verdicts[path.name] = known
            seen.add(path.name)
            out.append((version, known[1]))
        for name in set(self._verdicts) - seen:
            del self._verdicts[name]
        return out

    def load(self, version: int) -> Model:
        """The model of this shard's checkpoint at exactly ``version`` (CheckpointError if it is
        missing or corrupt)."""
        if self.directory is None:
            raise checkpoint.CheckpointError("-", "this shard writes no checkpoints")
        return rebuild(load_whole(self.directory, version), self.shard, self.policies)

    def _whole(self, found: checkpoint.Checkpoint) -> checkpoint.Checkpoint:
        """``found`` made whole: itself, or with the whole checkpoint it is a delta of (which must
        read back: CheckpointError names it)."""
        base = base_of(found.meta)
        if base is None:
            return found
        assert self.directory is not None
        return whole(found, checkpoint.load(checkpoint.path_of(self.directory, base)))

    def _needed(self, snapshot: checkpoint.Checkpoint) -> set[int]:
        """The versions retention must keep besides the ``keep`` newest: the one the whole job can
        restore, and the whole checkpoints that it, ``snapshot`` and the kept ones are deltas of."""
        assert self.directory is not None
        found = dict(self.examined())
        kept = [snapshot.version, self.protected, *sorted(found, reverse=True)[: self.keep]]
        needed = {self.protected}
        base = base_of(snapshot.meta)
        if base is not None:
            needed.add(base)
        for version in kept:
            if version in found and (of := self._base_version(version)) is not None:
                needed.add(of)
        return needed

    def _run(self) -> None:
        """The writer thread: writes the waiting snapshot, one at a time, for the life of the process."""
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._waiting is not None)
                assert self._waiting is not None
                snapshot, self._waiting, self._busy = self._waiting, None, True
            try:
                self._write(snapshot)
            except Exception:  # the writer must outlive one bad snapshot, or flush() would wait forever
                log.exception("checkpoint of version %d failed", snapshot.version)
            finally:
                del snapshot  # not held while waiting for the next one
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def _write(self, snapshot: checkpoint.Checkpoint) -> None:
        assert self.directory is not None  # due() said so
        base = base_of(snapshot.meta)
        try:
            path = checkpoint.save(self.directory, snapshot, keep=self.keep, protect=self._needed(snapshot))
            size = path.stat().st_size
            if base is None:
                log.info("checkpoint of version %d written to %s (%d bytes)", snapshot.version, path, size)
            else:
                rows = sum(len(v) for k, v in snapshot.arrays.items() if k.startswith(PREFIX) and k.endswith("/ids"))
                log.info("checkpoint of version %d written to %s (%d bytes: a delta of version %d, %d rows)",
                         snapshot.version, path, size, base, rows)  # fmt: skip
            with self._lock:
                if base is None:
                    clocks = dict(snapshot.meta.get("clocks", {}))
                    self._base, self._deltas = Base(snapshot.version, clocks), 0
                else:
                    self._deltas += 1
            if base is None and self.full_every > 1:
                self.on_full(clocks)
            self.failure = ""
        except (OSError, checkpoint.CheckpointError) as err:
            self.failure = f"checkpoint of version {snapshot.version} to {self.directory} failed: {err}"
            log.error("%s", self.failure)
