"""The parameter store of one PS shard: its dense variables, ``model_version`` and the update rules.

Free of gRPC: the servicer (``servicer.py``) translates calls into these methods and exceptions into
status codes. The rules (seed 000):

* Sync (default): a gradient is accepted only when ``0 <= version_ps - version <= tolerance``; the
  store sums ``grads_to_wait`` accepted gradients, applies their average once and bumps the version.
  Reads and updates are serialised by one lock so a pull never sees half an update.
* Async (``use_async``): every valid gradient is applied at once, with no store-wide lock; pulls read
  the live arrays concurrently (a pulled model may mix versions, as the design allows). With
  ``use_locking`` each variable's update holds that variable's lock. With ``lr_staleness_modulation``
  the push's learning rate is divided by its staleness, per call.

A gradient that is not finite or does not match the variables (name, dtype, shape) is refused with
:class:`GradientError` before anything changes. Every ``checkpoint_steps`` versions a copy of the
variables and optimizer state is written by a background thread (``checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elasticps.ps import checkpoint
from elasticps.api.optimizer import OptimizerConfig
from elasticps.ps.optimizers import Optimizer, make_optimizer
from elasticps.ps.staleness import modulated_lr, staleness

log = logging.getLogger(__name__)

_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)}


class GradientError(ValueError):
    """A gradient or model the store refuses; nothing was changed."""


class UninitializedError(RuntimeError):
    """The shard holds no model yet: a worker must push one first."""


@dataclass(frozen=True)
class StoreSettings:
    shard: int = 0
    use_async: bool = False
    lr_staleness_modulation: bool = False
    use_locking: bool = False
    grads_to_wait: int = 1
    sync_version_tolerance: int = 0
    checkpoint_dir: Path | None = None
    checkpoint_steps: int = 0
    keep_checkpoint_max: int = 3


@dataclass(frozen=True)
class PushOutcome:
    accepted: bool
    version: int  # the store's version after this push
    staleness: int
    learning_rate: float  # the learning rate this push was applied with (0 when rejected)


class ParameterStore:
    def __init__(self, settings: StoreSettings) -> None:
        if settings.grads_to_wait < 1:
            raise ValueError(f"grads_to_wait must be >= 1, got {settings.grads_to_wait}")
        self.settings = settings
        self._lock = threading.Lock()  # sync: reads and updates; both modes: initialisation
        self._version_lock = threading.Lock()  # async: the version counter only
        self._variables: dict[str, np.ndarray] = {}
        self._variable_locks: dict[str, threading.Lock] = {}
        self._optimizer: Optimizer | None = None
        self._version = 0
        self._sums: dict[str, np.ndarray] = {}
        self._summed = 0
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._moved = threading.Condition()  # notified whenever the version changes

    # ---- state -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def initialized(self) -> bool:
        return self._optimizer is not None

    @property
    def optimizer(self) -> Optimizer:
        if self._optimizer is None:
            raise UninitializedError(f"PS shard {self.settings.shard} holds no model yet")
        return self._optimizer

    def initialize(self, tensors: Mapping[str, np.ndarray], optimizer: OptimizerConfig) -> bool:
        """Takes the first model pushed to this shard; returns False (and changes nothing) later."""
        for name, value in tensors.items():
            if value.dtype not in _FLOATS:
                raise GradientError(f"variable {name!r}: dtype {value.dtype} is not a float type")
            if not _finite(value):
                raise GradientError(f"variable {name!r}: initial value is not finite")
        built = make_optimizer(optimizer)
        with self._lock:
            if self._optimizer is not None:
                return False
            self._install({n: np.array(v, copy=True) for n, v in tensors.items()}, built, 0)
        log.info(
            "shard %d initialised: %d variables, %s", self.settings.shard, len(tensors), built.config.name
        )
        return True

    def _install(self, variables: dict[str, np.ndarray], optimizer: Optimizer, version: int) -> None:
        for name, value in variables.items():
            optimizer.register(name, value.shape, value.dtype)
        self._variables = variables
        self._variable_locks = {name: threading.Lock() for name in variables}
        # Sync sums gradients until grads_to_wait arrive; async applies each at once and needs none.
        self._sums = {} if self.settings.use_async else {n: np.zeros_like(v) for n, v in variables.items()}
        self._summed = 0
        self._version = version
        self._optimizer = optimizer

    def wait_newer(self, version: int, timeout_s: float) -> int:
        """Blocks until the version differs from ``version`` or ``timeout_s`` passes; the version."""
        with self._moved:
            self._moved.wait_for(lambda: self._version != version, timeout_s)
        return self._version

    def _notify_moved(self) -> None:
        with self._moved:
            self._moved.notify_all()

    @contextlib.contextmanager
    def reading(self) -> Iterator[tuple[int, Mapping[str, np.ndarray]]]:
        """The version and the variables, to be read (encoded) inside the ``with`` block.

        Sync: a consistent view (updates wait). Async: the live arrays, updated concurrently.
        """
        if self.settings.use_async:
            yield self._version, self._variables
            return
        with self._lock:
            yield self._version, self._variables

    # ---- updates -----------------------------------------------------------------------------
    def push(self, gradients: Mapping[str, np.ndarray], version: int, learning_rate: float = 0.0) -> PushOutcome:
        """Applies (async) or accumulates (sync) one worker's gradients, computed on ``version``."""
        optimizer = self.optimizer
        self._check(gradients)
        if not (math.isfinite(learning_rate) and learning_rate >= 0):
            # Refused here, before anything changes: the optimizer would raise in the middle of an
            # update (sync: after the gradient was summed), leaving the accumulator corrupted.
            raise GradientError(f"learning rate {learning_rate!r} must be finite and >= 0 (0: the PS's)")
        base_lr = learning_rate if learning_rate > 0 else optimizer.learning_rate
        if self.settings.use_async:
            return self._push_async(optimizer, gradients, version, base_lr)
        return self._push_sync(optimizer, gradients, version, base_lr)

    def _push_async(
        self, optimizer: Optimizer, gradients: Mapping[str, np.ndarray], version: int, base_lr: float
    ) -> PushOutcome:
        stale = staleness(self._version, version)
        lr = modulated_lr(base_lr, stale, self.settings.lr_staleness_modulation)
        for name, gradient in gradients.items():
            if self.settings.use_locking:
                with self._variable_locks[name]:
                    optimizer.apply(name, self._variables[name], gradient, lr)
            else:
                optimizer.apply(name, self._variables[name], gradient, lr)
        with self._version_lock:
            self._version += 1
            new_version = self._version
        self._notify_moved()
        self._maybe_checkpoint(new_version)
        return PushOutcome(True, new_version, stale, lr)

    def _push_sync(
        self, optimizer: Optimizer, gradients: Mapping[str, np.ndarray], version: int, base_lr: float
    ) -> PushOutcome:
        with self._lock:
            behind = self._version - version
            if not 0 <= behind <= self.settings.sync_version_tolerance:
                return PushOutcome(False, self._version, max(0, behind), 0.0)
            for name, gradient in gradients.items():
                np.add(self._sums[name], gradient, out=self._sums[name])
            self._summed += 1
            if self._summed >= self.settings.grads_to_wait:
                scale = 1.0 / self._summed
                for name, total in self._sums.items():
                    np.multiply(total, scale, out=total)
                    optimizer.apply(name, self._variables[name], total, base_lr)
                    total.fill(0)
                self._summed = 0
                self._version += 1
                self._notify_moved()
                self._maybe_checkpoint(self._version)
            return PushOutcome(True, self._version, behind, base_lr)

    def _check(self, gradients: Mapping[str, np.ndarray]) -> None:
        unknown = sorted(set(gradients) - set(self._variables))
        if unknown:
            raise GradientError(f"shard {self.settings.shard} holds no variable {unknown[0]!r}")
        missing = sorted(set(self._variables) - set(gradients))
        if missing:
            raise GradientError(f"no gradient for variable {missing[0]!r}")
        for name, gradient in gradients.items():
            variable = self._variables[name]
            if gradient.shape != variable.shape:
                raise GradientError(
                    f"gradient {name!r}: shape {list(gradient.shape)} != variable shape {list(variable.shape)}"
                )
            if gradient.dtype != variable.dtype:
                raise GradientError(f"gradient {name!r}: dtype {gradient.dtype} != {variable.dtype}")
            if not _finite(gradient):
                raise GradientError(f"gradient {name!r} holds NaN or infinity")

    # ---- checkpoints -------------------------------------------------------------------------
    def _checkpoint_dir(self) -> Path | None:
        if self.settings.checkpoint_dir is None:
            return None
        return self.settings.checkpoint_dir / f"ps-{self.settings.shard}"

    def _maybe_checkpoint(self, version: int) -> None:
        steps = self.settings.checkpoint_steps
        if steps <= 0 or version % steps or self._checkpoint_dir() is None:
            return
        # Sync calls this under the store lock, so the copy is one version; async copies live arrays.
        snapshot = self.snapshot()
        self._writer.submit(self._write, snapshot)

    def snapshot(self) -> checkpoint.Checkpoint:
        optimizer = self.optimizer
        arrays = {f"var/{name}": value.copy() for name, value in self._variables.items()}
        arrays.update({f"opt/{key}": value.copy() for key, value in optimizer.state().items()})
        meta = {
            "shard": self.settings.shard,
            "optimizer": {"name": optimizer.config.name, "params": dict(optimizer.config.params)},
        }
        return checkpoint.Checkpoint(version=self._version, arrays=arrays, meta=meta)

    def _write(self, snapshot: checkpoint.Checkpoint) -> None:
        directory = self._checkpoint_dir()
        assert directory is not None
        try:
            path = checkpoint.save(directory, snapshot, keep=self.settings.keep_checkpoint_max)
            log.info("checkpoint of version %d written to %s", snapshot.version, path)
        except OSError as err:
            log.error("checkpoint of version %d failed: %s", snapshot.version, err)

    def flush_checkpoints(self) -> None:
        """Waits for the checkpoints already submitted (tests; shutdown)."""
        self._writer.submit(lambda: None).result()

    def restore(self) -> bool:
        """Loads the newest good checkpoint of this shard, if any; corrupt ones are skipped."""
        directory = self._checkpoint_dir()
        if directory is None:
            return False
        found = checkpoint.load_latest(directory)
        if found is None:
            return False
        spec = found.meta.get("optimizer", {})
        config = OptimizerConfig(name=str(spec.get("name")), params=dict(spec.get("params", {})))
        optimizer = make_optimizer(config)
        variables = {
            key.removeprefix("var/"): np.array(value, copy=True)
            for key, value in found.arrays.items()
            if key.startswith("var/")
        }
        with self._lock:
            self._install(variables, optimizer, found.version)
            self._notify_moved()
            optimizer.load_state(
                {key.removeprefix("opt/"): value for key, value in found.arrays.items() if key.startswith("opt/")}
            )
        log.info("shard %d restored version %d from %s", self.settings.shard, found.version, directory)
        return True


def _finite(array: np.ndarray) -> bool:
    # Fast path, one pass and no temporary bool array: a NaN or infinity anywhere makes the sum
    # non-finite. A non-finite sum may also come from large finite values overflowing, so only
    # then the exact (element-wise) check decides.
    wide = np.float32 if array.dtype == np.float16 else None
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(float(np.sum(array, dtype=wide))):
            return True
    return bool(np.isfinite(array).all())
