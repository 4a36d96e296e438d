"""A job's training mode, derived once from ``spec.training``: the one place that reads the mode flags.

Callers: parsing (cross-field rules), the planner (the MODE column), ``elasticps run`` (its job
line), the PS (which update rule it serves: ``ps/rules.py``) and the worker (which step it takes:
``worker/steps.py``). Everything after this module asks the :class:`TrainingMode`, never the raw
flags, so a new mode is a new :class:`UpdateRule` member, a spec field that selects it, one rule on
the PS and one step on the worker.

Under the ``parameterServer`` strategy a mode is a pair (seed 000): the PS's update rule (sync
averaging or async apply; staleness-aware learning rates wrap the async rule) and the worker's step
(sync with retraining of rejected minibatches, async, or SSP: async with local steps between pulls).
The async-only knobs (staleness-aware rates, ``useLocking``, ``overlapPull``, ``getModelFrequency`` > 1) are refused
with sync rather than ignored (:meth:`TrainingMode.problems`), so a sync mode is always plain Sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from elasticps.api.spec import TrainingSpec


OVERLAP_PULL_SYNC = "needs useAsync: true (a sync worker always starts its pull as the round commits)"


class UpdateRule(str, Enum):
    """How a PS shard turns pushed gradients into model versions."""

    SYNC = "sync"  # average grads_to_wait current gradients into one update
    ASYNC = "async"  # apply every gradient at once


@dataclass(frozen=True)
class TrainingMode:
    """What a job trains with. ``pull_every``: the worker pulls every k steps (SSP when > 1);
    ``overlap_pull``: async and SSP pulls leave with the push before them (``worker/steps.py``)."""

    rule: UpdateRule = UpdateRule.SYNC
    staleness_lr: bool = False
    use_locking: bool = False
    pull_every: int = 1
    overlap_pull: bool = False

    @classmethod
    def of(cls, training: TrainingSpec) -> TrainingMode:
        return cls(
            rule=UpdateRule.ASYNC if training.use_async else UpdateRule.SYNC,
            staleness_lr=training.lr_staleness_modulation,
            use_locking=training.use_locking,
            pull_every=training.get_model_frequency,
            overlap_pull=training.overlap_pull,
        )

    @property
    def label(self) -> str:
        """``status.mode`` and the MODE column: Sync, or Async with +StalenessLR and +SSP<k>."""
        if self.rule is UpdateRule.SYNC:
            return "Sync"  # problems() refuses every async-only knob with sync
        parts = [self.rule.value.capitalize()]
        if self.staleness_lr:
            parts.append("StalenessLR")
        if self.pull_every > 1:
            parts.append(f"SSP{self.pull_every}")
        return "+".join(parts)

    def problems(self) -> list[tuple[str, str]]:
        """Combinations that cannot run, as (field, why), the field in the spec's spelling."""
        found: list[tuple[str, str]] = []
        if self.rule is UpdateRule.ASYNC:
            return found
        if self.staleness_lr:
            # Accepted gradients in sync mode are current; modulation would silently do nothing.
            found.append(("lrStalenessModulation", "needs useAsync: true"))
        if self.use_locking:
            found.append(("useLocking", "needs useAsync: true (sync already applies one update at a time)"))
        if self.overlap_pull:
            found.append(("overlapPull", OVERLAP_PULL_SYNC))
        if self.pull_every > 1:
            found.append(("getModelFrequency", "needs useAsync: true (local steps between pulls are asynchronous SGD)"))
        return found

