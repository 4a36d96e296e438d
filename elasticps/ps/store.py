"""The parameter store of one PS shard: its model (tables and optimizer), ``model_version``, its rule.

Free of gRPC: the servicer (``servicer.py``) translates calls into these methods and exceptions into
status codes. The store only moves data; what a push does is its update rule's (``rules.py``),
chosen once from ``settings.mode``:

* a push is checked against the model's tables (``tables.py``: names, dtypes, shapes, finiteness)
  and its learning rate, and refused with :class:`GradientError` before anything changes; then the
  rule applies or stages it and says when the version moves;
* sync: a commit from the coordinator applies one round's staged gradients (:meth:`ParameterStore.commit`);
  with ``round_log`` set, each commit's minibatches are appended there, one JSON line per round,
  and a line for each restore from a checkpoint (the rounds from its version on left the model);
* a pull reads under the rule's guard (:meth:`ParameterStore.reading`); whether a version can be
  encoded once for every puller is :attr:`ParameterStore.consistent_reads`, the rule's answer;
* the model's non-trainable state (BatchNorm statistics) comes with the initial model and with every
  push, beside the gradients, as the state table's update (``state_table.py`` has the rule); pulls
  read it with the variables (:meth:`ParameterStore.reading_model`);
* embedding tables (``embeddings.py``) come with the initial model as specs, their rows made as
  pulls ask for them (:meth:`ParameterStore.pull_embeddings`, under the rule's guard as dense
  pulls); each push may carry row gradients for them, one more table of the update;
* every new version is offered to the checkpoint schedule (``checkpointing.py``), which also
  restores the newest good checkpoint at start-up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticps.api.embedding import PART_GRADIENT, PART_IDS, PART_ROWS, EmbeddingError, TableSpec, as_ids
from elasticps.api.optimizer import MAX_LEARNING_RATE, OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.applied import AppliedTasks, TaskProgress
from elasticps.ps.arrivals import PushHead, Stream
from elasticps.ps.checkpointing import Base, Checkpointing, capture
from elasticps.api.table_kinds import TableKind
from elasticps.ps.checkpoint_deltas import table_key
from elasticps.ps.embeddings import RowGradient
from elasticps.ps.tables import RowStats
from elasticps.ps.errors import GradientError, ModelMismatch, UninitializedError
from elasticps.ps.layout import Described, Layout
from elasticps.ps.kinds import KINDS, Making
from elasticps.ps.model import Model
from elasticps.ps.optimizers import Optimizer, make_optimizer
from elasticps.ps.outcomes import PushOutcome
from elasticps.ps.rules import CommitOutcome, Gradient, RoundError, Rule, make_rule
from elasticps.ps.settings import StoreSettings
from elasticps.ps.state_table import STATE
from elasticps.ps.tables import DENSE, FLOATS, Table
from elasticps.ps.versions import ModelVersion, version_problem

__all__ = [
    "CommitOutcome",
    "GradientError",
    "ModelMismatch",
    "ParameterStore",
    "PushOutcome",
    "RoundError",
    "StoreSettings",
    "UninitializedError",
]

log = logging.getLogger(__name__)

_NOTHING: Mapping[str, np.ndarray] = {}
_NO_ROWS: Mapping[str, Mapping[str, np.ndarray]] = {}



@dataclass(frozen=True)
class Reading:
    """What a pull reads (see :meth:`ParameterStore.reading_model`): valid inside the ``with`` block."""

    incarnation: int
    version: int
    variables: Mapping[str, np.ndarray]
    state: Mapping[str, np.ndarray]


def _disjoint(variables: Mapping[str, object], state: Mapping[str, object]) -> None:
    both = sorted(set(variables) & set(state))
    if both:
        raise GradientError(f"{both[0]!r} is both a variable and a state tensor")


def _check_offer(version: int, incarnation: int, variables: Mapping[str, object], state: Mapping[str, object],
                 tables: Sequence[TableSpec]) -> None:  # fmt: skip
    """What a pushed model's head must be, its values aside (GradientError)."""
    problem = version_problem("a model's version", version) or version_problem("a model's incarnation", incarnation)
    if problem:
        raise GradientError(problem)  # its next update would overflow the version the shard answers with
    _disjoint(variables, state)
    if len({spec.name for spec in tables}) != len(tables):
        raise GradientError("the pushed model names an embedding table twice")


MAX_NAME = 1024  # characters of a push's worker and minibatch names


def _check_head(version: int, learning_rate: float, worker: str, minibatch: str) -> None:
    """A push's head, checked before anything changes (GradientError names the field)."""
    if version < 0:
        # Sync refuses it as too new for any round; async would count its staleness from a
        # version no model had: refused in every mode.
        raise GradientError(f"PushHead.version must be >= 0, got {version}")
    if not (math.isfinite(learning_rate) and 0 <= learning_rate <= MAX_LEARNING_RATE):
        # Refused here, before anything changes: the optimizer would raise in the middle of an
        # update (sync: after the gradient was summed), leaving the accumulator corrupted.
        raise GradientError(
            f"PushHead.learning_rate: learning rate {learning_rate!r} must be finite, >= 0 and <= {MAX_LEARNING_RATE:g} (0: the PS's)"
        )
    if len(worker) > MAX_NAME:
        raise GradientError(f"PushHead.worker is {len(worker)} characters long, at most {MAX_NAME}")
    if len(minibatch) > MAX_NAME:
        raise GradientError(f"PushHead.minibatch is {len(minibatch)} characters long, at most {MAX_NAME}")


def _row_gradient(table: str, parts: Mapping[str, np.ndarray]) -> RowGradient:
    if set(parts) != {PART_IDS, PART_GRADIENT}:
        raise GradientError(f"embedding table {table!r}: a push sends {PART_IDS!r} and {PART_GRADIENT!r}, got {sorted(parts)}")
    try:
        return RowGradient(as_ids(parts[PART_IDS], f"embedding table {table!r}: ids"), parts[PART_GRADIENT])
    except EmbeddingError as err:
        raise GradientError(str(err)) from None


class ParameterStore:
    def __init__(self, settings: StoreSettings, rule: Rule | None = None) -> None:
        self.settings = settings
        self._rule = rule if rule is not None else make_rule(settings)
        self._installing = threading.Lock()  # one model installed, once (initialise or restore)
        self._model: Model | None = None
        self._checkpoints = Checkpointing.for_shard(settings)
        self._checkpoints.on_full = self._forget_evictions
        self._version = ModelVersion(on_advance=self._advanced)
        self._round_log_lock = threading.Lock()
        self.applied = AppliedTasks()  # sync: the task ledger's copy (``applied.py``)
        # A new number for every start of this shard: the coordinator tells a restarted shard by it.
        self.boot = secrets.randbits(62) + 1
        # Which timeline the version counts on: bumped by the coordinator with every rollback.
        self.incarnation = 0

    # ---- state -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version.value

    @property
    def initialized(self) -> bool:
        return self._model is not None

    @property
    def rule(self) -> Rule:
        return self._rule

    @property
    def consistent_reads(self) -> bool:
        """True when a version's parameters never change while pulls read them (the rule's answer)."""
        return self._rule.consistent_reads

    @property
    def optimizer(self) -> Optimizer:
        return self._require_model().optimizer

    def _require_model(self) -> Model:
        model = self._model
        if model is None:
            raise UninitializedError(f"PS shard {self.settings.shard} holds no model yet")
        return model

    def initialize(
        self,
        tensors: Mapping[str, np.ndarray],
        optimizer: OptimizerConfig,
        version: int = 0,
        incarnation: int = 0,
        state: Mapping[str, np.ndarray] = _NOTHING,
        tables: Sequence[TableSpec] = (),
        shards: int = 1,
        received: bool = False,
    ) -> bool:
        """Takes the first model pushed to this shard; later returns False and changes nothing when
        the same model (names, shapes, dtypes) is pushed again (a worker restarts, a shard is
        repaired), and raises :class:`ModelMismatch` when another one is.

        ``version``: the model's version, 0 for a new job; a worker that repairs a shard which lost
        its model (restarted without a checkpoint) pushes its copy at the version the others hold.
        ``state``: the model's non-trainable state tensors that this shard holds (finite floats).
        ``tables``: the model's embedding tables, of which this shard holds the ids ``id mod
        shards == shard`` (``shards``: the job's PS count).
        An *empty* model (no variable, no state: the placement put none of the model here) is held
        until a non-empty one is pushed, which replaces it at the shard's version and incarnation:
        an empty push can never take the place of a model's variables.
        ``received``: ``tensors`` were received into this PS's own buffers, for this call alone:
        the shard may keep them as its variables rather than copy them."""
        _check_offer(version, incarnation, tensors, state, tables)
        shard = self.settings.shard
        built = make_optimizer(self._rule.optimizer(optimizer))
        made: dict[str, Table[Any]] = {}
        for kind, part in ((TableKind.DENSE, tensors), (TableKind.STATE, state)):  # implicit in every model
            made[KINDS[kind].key(None)] = KINDS[kind].create(Making(shard, shards, built, tensors=part, received=received))
        try:
            for spec in tables:
                making = Making(shard, shards, built, spec=spec, policy=self.settings.row_policies.of(spec.name))
                made[KINDS[spec.kind].key(spec)] = KINDS[spec.kind].create(making)
        except EmbeddingError as err:
            raise GradientError(str(err)) from None
        with self._installing:
            held = self._model
            if held is not None and not (held.empty and (tensors or state or tables)):
                difference = held.difference(tensors, state, tables)
                if difference:
                    raise ModelMismatch(f"PS shard {self.settings.shard} holds another model: {difference}")
                return False
            if held is not None:
                version, incarnation = self._version.value, self.incarnation
            self._install(Model.of(made, built), version, incarnation)
        log.info(
            "shard %d initialised at version %d: %d variables, %d state tensors, %d parameter bytes, "
            "%d embedding tables, %s",
            self.settings.shard, version, len(tensors), len(state),
            sum(value.nbytes for value in tensors.values()), len(tables), built.config.name,
        )
        return True

    def holds(
        self,
        variables: Mapping[str, Any],
        state: Mapping[str, Any],
        optimizer: OptimizerConfig,
        version: int = 0,
        tables: Sequence[TableSpec] = (),
    ) -> bool:
        """True when the shard holds a model (not an empty one) and the pushed one is that model
        (``variables`` and ``state``: anything with a shape and a dtype, e.g. a stream head's
        tensor specs, so the pushed values need not be kept); pushing it would change nothing.
        ModelMismatch when it holds another one; False when it holds none yet. The rest is
        checked as :meth:`initialize` checks it (GradientError, OptimizerError), values aside."""
        held = self._model
        if held is None or held.empty:
            return False
        _check_offer(version, 0, variables, state, tables)
        for kind, tensors in (("variable", variables), ("state", state)):
            for name, tensor in tensors.items():
                if np.dtype(tensor.dtype) not in FLOATS:
                    raise GradientError(f"{kind} {name!r}: dtype {tensor.dtype} is not a float type")
        make_optimizer(self._rule.optimizer(optimizer))
        difference = held.difference(variables, state, tables)
        if difference:
            raise ModelMismatch(f"PS shard {self.settings.shard} holds another model: {difference}")
        return True

    def _install(self, model: Model, version: int, incarnation: int | None = None) -> None:
        with self._rule.guard():
            self._rule.reset(model)
            if incarnation is not None:
                self.incarnation = incarnation
            self._version.reset(version)
            self.applied.installed(version)
            self._model = model  # last: a push or pull that sees the model sees it whole

    def on_version_change(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after every change of the version or incarnation, in the changing
        thread (it must not block: the servicer's long polls schedule a wake-up on their loop)."""
        self._version.listen(listener)

    @property
    def layout(self) -> Layout | None:
        """The names, dtypes, shapes and bytes of the model's tensors (None: no model yet), read
        without a lock: what the servicer checks a stream's head against."""
        model = self._model
        return None if model is None else model.layout

    def wait_newer(self, version: int, timeout_s: float) -> int:
        """Blocks until the version differs from ``version`` or ``timeout_s`` passes; the version."""
        return self._version.wait_newer(version, timeout_s)

    @contextlib.contextmanager
    def reading(self) -> Iterator[tuple[int, int, Mapping[str, np.ndarray]]]:
        """The incarnation, version and dense variables, to be read (encoded) inside the ``with`` block.

        Under the rule's guard: sync, a consistent view (updates wait); async, the live arrays.
        """
        with self.reading_model() as found:
            yield found.incarnation, found.version, found.variables

    @contextlib.contextmanager
    def reading_model(self) -> Iterator[Reading]:
        """:meth:`reading` with the model's state tensors: what a pull sends."""
        with self._rule.guard():
            model = self._model
            if model is None:
                yield Reading(self.incarnation, self._version.value, _NOTHING, _NOTHING)
            else:
                yield Reading(self.incarnation, self._version.value, model.dense.variables, model.state.values)

    def pull_embeddings(
        self, ids: Mapping[str, np.ndarray | None], make: bool = True
    ) -> tuple[int, int, dict[str, dict[str, np.ndarray]]]:
        """The incarnation, version and, per table, the rows of ``ids`` (``{"rows": ...}``; rows
        not held yet are made as the table's policy admits them, unless ``make`` is false:
        evaluation and prediction) or, for ids None, every row held (``{"ids": ..., "rows": ...}``),
        read under the rule's guard (sync: the rows of that version). GradientError names a
        table this shard does not hold or ids it cannot serve."""
        model = self._require_model()
        with self._rule.guard():
            rows: dict[str, dict[str, np.ndarray]] = {}
            for name, wanted in ids.items():
                table = model.embeddings.get(name)
                if table is None:
                    raise GradientError(f"PS shard {self.settings.shard} holds no embedding table {name!r}")
                if wanted is None:
                    held_ids, held_rows = table.held()
                    rows[name] = {PART_IDS: held_ids, PART_ROWS: held_rows}
                    continue
                try:
                    rows[name] = {PART_ROWS: table.pull(wanted, make)}
                except EmbeddingError as err:
                    raise GradientError(str(err)) from None
            return self.incarnation, self._version.value, rows

    def rows_held(self) -> dict[str, int]:
        """Each embedding table's rows on this shard now (none without a model)."""
        model = self._model
        return {} if model is None else {name: table.rows_held for name, table in model.embeddings.items()}

    def row_stats(self) -> dict[str, RowStats]:
        """Each embedding table's rows on this shard and what its policy did (none without a model)."""
        model = self._model
        return {} if model is None else {name: table.stats() for name, table in model.embeddings.items()}

    def embedding_bytes(self) -> int:
        """The memory of this shard's embedding tables (their arrays' capacity and indexes)."""
        model = self._model
        return 0 if model is None else sum(table.nbytes() for table in model.embeddings.values())

    # ---- updates -----------------------------------------------------------------------------
    def push(
        self,
        gradients: Mapping[str, np.ndarray],
        version: int,
        learning_rate: float = 0.0,
        worker: str = "",
        minibatch: str = "",
        incarnation: int = 0,
        state: Mapping[str, np.ndarray] = _NOTHING,
        embeddings: Mapping[str, Mapping[str, np.ndarray]] = _NO_ROWS,
        received: bool = False,
    ) -> PushOutcome:
        """One worker's dense gradients, computed on ``version``, handed to the rule once checked,
        with the worker's current values of (some of) the state tensors (``state_table.py``) and
        its row gradients per embedding table (``{"ids": ..., "gradient": ...}`` each).
        ``received``: the arrays were received into this PS's own buffers, which nothing else
        reads; a sync round may make its sum in them (``tables.DenseSum``).

        Gradients of another incarnation (computed before a rollback) are refused, changing nothing."""
        model = self._require_model()
        _check_head(version, learning_rate, worker, minibatch)
        if incarnation != self.incarnation:
            return PushOutcome(False, self._version.value, 0, 0.0)
        _disjoint(gradients, state)
        update: dict[str, object] = {DENSE: gradients, STATE: state} if state else {DENSE: gradients}
        for name, parts in embeddings.items():
            update[model.keys.get(name, table_key(name))] = _row_gradient(name, parts)
        model.check(update)
        base_lr = learning_rate if learning_rate > 0 else model.optimizer.learning_rate
        return self._rule.push(model, self._version, Gradient(update, version, base_lr, worker, minibatch, received))

    def open_stream(
        self,
        tensors: Sequence[Described],
        version: int,
        learning_rate: float = 0.0,
        worker: str = "",
        minibatch: str = "",
        incarnation: int = 0,
    ) -> Stream | None:
        """A stream that takes a push piece by piece as it arrives (``arrivals.py``: a sync round's
        sum made on arrival), for a push of exactly the model's dense variables (``tensors``, from
        its head, admitted by ``intake.py``: names, dtypes and shapes); None when the rule does
        not take this push so (another mode, a push carrying state or rows, another version or
        incarnation, a round being committed): receive it whole and :meth:`push` it.
        GradientError for a head :meth:`push` would refuse."""
        model = self._require_model()
        _check_head(version, learning_rate, worker, minibatch)
        variables = model.dense.variables
        if (
            incarnation != self.incarnation
            or any(spec.state or spec.table for spec in tensors)
            or len(tensors) != len(variables)
            or any(spec.name not in variables or (spec.dtype, spec.shape) != (variables[spec.name].dtype,
                   variables[spec.name].shape) for spec in tensors)
        ):
            return None
        base_lr = learning_rate if learning_rate > 0 else model.optimizer.learning_rate
        return self._rule.open_stream(self._version, PushHead(version, base_lr, worker, minibatch))

    def commit(
        self, round_: int, workers: Sequence[str], dry_run: bool = False, tasks: Sequence[TaskProgress] = (),
        restorable: int = 0,
    ) -> CommitOutcome:
        """Applies sync round ``round_`` with the staged gradients of ``workers`` (RoundError if it
        cannot), bringing the training ``tasks`` forward in the ledger's copy; with ``dry_run``
        only checks that it could. ``restorable``: the newest version every shard and the ledger
        can restore (0: none), whose checkpoint is kept whatever ``keep_checkpoint_max`` says."""
        if restorable > 0 and not dry_run:
            self._checkpoints.protected = restorable
        outcome = self._rule.commit(self._require_model(), self._version, round_, workers, dry_run)
        if outcome.applied:
            self.applied.committed(outcome.version, tasks)
            if self.settings.round_log is not None:
                self._log_round(round_, outcome)
        return outcome

    def _log_round(self, round_: int, outcome: CommitOutcome) -> None:
        self._append_to_round_log({"round": round_, "minibatches": list(outcome.applied), "summed": outcome.summed})

    def _append_to_round_log(self, entry: dict[str, object]) -> None:
        """One line of the round log: a round committed, or the model restored from a checkpoint
        (``{"restored": version}``: the rounds from that version on are no longer in the model)."""
        path = self.settings.round_log
        if path is None:
            return
        line = json.dumps({"shard": self.settings.shard, **entry})
        try:
            with self._round_log_lock:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as log_file:
                    log_file.write(line + "\n")
        except OSError as err:  # an audit aid: never fails the commit that was applied
            log.error("cannot append to %s: %s", path, err)

    # ---- checkpoints -------------------------------------------------------------------------
    def _advanced(self, version: int) -> None:
        self._checkpoints.after_update(version, self.snapshot)

    def snapshot(self, base: Base | None = None) -> checkpoint.Checkpoint:
        """The shard's model now, whole, or with its tables of rows as deltas since ``base``."""
        deltas = self._checkpoints.full_every > 1
        return capture(self._require_model(), self._version.value, self.settings.shard, base, deltas)

    def _forget_evictions(self, clocks: Mapping[str, int]) -> None:
        """A whole checkpoint was written at these tables' clocks: their evictions before are no delta's."""
        model = self._model
        for name, table in ({} if model is None else model.embeddings).items():
            if name in clocks:
                table.forget_evictions(clocks[name])

    def flush_checkpoints(self) -> None:
        """Waits for the checkpoints already submitted (tests; shutdown)."""
        self._checkpoints.flush()

    def checkpoint_final(self) -> None:
        """A checkpoint of the current version, due or not (the shard stops; see ``Checkpointing.final``)."""
        if self.initialized:
            self._checkpoints.final(self._version.value, self.snapshot)

    def checkpoint_versions(self) -> list[int]:
        """The versions of this shard's checkpoints that read back whole, newest first."""
        return self._checkpoints.versions()

    def unreadable_checkpoints(self) -> list[str]:
        """This shard's checkpoint files that do not read back, each as ``<file>: <why>``."""
        return self._checkpoints.unreadable()

    @property
    def checkpoint_failure(self) -> str:
        """Why this shard's latest checkpoint write failed ("": it did not)."""
        return self._checkpoints.failure

    def roll_back(self, version: int, incarnation: int) -> None:
        """Installs this shard's checkpoint of exactly ``version`` as model ``(incarnation, version)``
        (the coordinator rolls every shard back to one version); CheckpointError if it cannot."""
        model = self._checkpoints.load(version)
        with self._installing:
            self._install(model, version, incarnation)
            self._checkpoints.rolled_back(version)
        self._append_to_round_log({"restored": version})
        log.info("shard %d rolled back to version %d (incarnation %d), embedding rows %s", self.settings.shard, version,
                 incarnation, self.rows_held())

    def restore(self) -> bool:
        """Loads the newest good checkpoint of this shard, if any; corrupt ones are skipped."""
        found = self._checkpoints.restore()
        if found is None:
            return False
        model, version = found
        with self._installing:
            self._install(model, version)
        self._append_to_round_log({"restored": version})
        log.info("shard %d restored version %d from %s", self.settings.shard, version, self._checkpoints.directory)
        return True
