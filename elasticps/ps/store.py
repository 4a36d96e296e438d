"""The parameter store of one PS shard: its model (tables and optimizer), ``model_version``, its rule.

Free of gRPC: the servicer (``servicer.py``) translates calls into these methods and exceptions into
status codes. The store only moves data; what a push does is its update rule's (``rules.py``),
chosen once from ``settings.mode``:

* a push is checked against the model's tables (``tables.py``: names, dtypes, shapes, finiteness)
  and its learning rate, and refused with :class:`GradientError` before anything changes; then the
  rule applies or holds it and says when the version moves;
* a pull reads under the rule's guard (:meth:`ParameterStore.reading`); whether a version can be
  encoded once for every puller is :attr:`ParameterStore.consistent_reads`, the rule's answer;
* every new version is offered to the checkpoint schedule (``checkpointing.py``), which also
  restores the newest good checkpoint at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator, Mapping

import numpy as np

from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps import checkpoint
from elasticps.ps.checkpointing import Checkpointing, capture
from elasticps.ps.errors import GradientError, UninitializedError
from elasticps.ps.model import Model
from elasticps.ps.optimizers import Optimizer, make_optimizer
from elasticps.ps.rules import PushOutcome, Rule, make_rule
from elasticps.ps.settings import StoreSettings
from elasticps.ps.tables import DENSE, DenseTable
from elasticps.ps.versions import ModelVersion

__all__ = ["GradientError", "ParameterStore", "PushOutcome", "StoreSettings", "UninitializedError"]

log = logging.getLogger(__name__)


class ParameterStore:
    def __init__(self, settings: StoreSettings, rule: Rule | None = None) -> None:
        self.settings = settings
        self._rule = rule if rule is not None else make_rule(settings)
        self._installing = threading.Lock()  # one model installed, once (initialise or restore)
        self._model: Model | None = None
        self._checkpoints = Checkpointing.for_shard(settings)
        self._version = ModelVersion(on_advance=self._advanced)

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

    def initialize(self, tensors: Mapping[str, np.ndarray], optimizer: OptimizerConfig) -> bool:
        """Takes the first model pushed to this shard; returns False (and changes nothing) later."""
        dense = DenseTable.create(tensors, self.settings.shard)
        built = make_optimizer(optimizer)
        with self._installing:
            if self._model is not None:
                return False
            self._install(Model(dense, built), 0)
        log.info("shard %d initialised: %d variables, %s", self.settings.shard, len(tensors), built.config.name)
        return True

    def _install(self, model: Model, version: int) -> None:
        with self._rule.guard():
            self._rule.reset(model)
            self._version.reset(version)
            self._model = model  # last: a push or pull that sees the model sees it whole

    def wait_newer(self, version: int, timeout_s: float) -> int:
        """Blocks until the version differs from ``version`` or ``timeout_s`` passes; the version."""
        return self._version.wait_newer(version, timeout_s)

    @contextlib.contextmanager
    def reading(self) -> Iterator[tuple[int, Mapping[str, np.ndarray]]]:
        """The version and the dense variables, to be read (encoded) inside the ``with`` block.

        Under the rule's guard: sync, a consistent view (updates wait); async, the live arrays.
        """
        with self._rule.guard():
            model = self._model
            yield self._version.value, ({} if model is None else model.dense.variables)

    # ---- updates -----------------------------------------------------------------------------
    def push(self, gradients: Mapping[str, np.ndarray], version: int, learning_rate: float = 0.0) -> PushOutcome:
        """One worker's dense gradients, computed on ``version``, handed to the rule once checked."""
        model = self._require_model()
        update = {DENSE: gradients}
        model.check(update)
        if not (math.isfinite(learning_rate) and learning_rate >= 0):
            # Refused here, before anything changes: the optimizer would raise in the middle of an
            # update (sync: after the gradient was summed), leaving the accumulator corrupted.
            raise GradientError(f"learning rate {learning_rate!r} must be finite and >= 0 (0: the PS's)")
        base_lr = learning_rate if learning_rate > 0 else model.optimizer.learning_rate
        return self._rule.push(model, self._version, update, version, base_lr)

    # ---- checkpoints -------------------------------------------------------------------------
    def _advanced(self, version: int) -> None:
        self._checkpoints.after_update(version, self.snapshot)

    def snapshot(self) -> checkpoint.Checkpoint:
        return capture(self._require_model(), self._version.value, self.settings.shard)

    def flush_checkpoints(self) -> None:
        """Waits for the checkpoints already submitted (tests; shutdown)."""
        self._checkpoints.flush()

    def restore(self) -> bool:
        """Loads the newest good checkpoint of this shard, if any; corrupt ones are skipped."""
        found = self._checkpoints.restore()
        if found is None:
            return False
        model, version = found
        with self._installing:
            self._install(model, version)
        log.info("shard %d restored version %d from %s", self.settings.shard, version, self._checkpoints.directory)
        return True
