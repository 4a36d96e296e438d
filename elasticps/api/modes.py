"""A job's training mode, derived once from ``spec.training``: the one place that reads the mode flags.

Callers: parsing (cross-field rules), the planner (the MODE column), ``elasticps run`` (its job
line), the PS (which update rule it serves: ``ps/rules.py``) and the worker (which step it takes:
``worker/steps.py``). Everything after this module asks the :class:`TrainingMode`, never the raw
flags, so a new mode is a new :class:`UpdateRule` member, a spec field that selects it, one rule on
the PS and one step on the worker.

Under the ``parameterServer`` strategy a mode is a pair (seed 000): the PS's update rule (sync
averaging, async apply, or LocalSGD's model averaging; staleness-aware learning rates wrap the async
rule) and the worker's step (sync with retraining of rejected minibatches, async, SSP: async with
local steps between pulls, or LocalSGD: K local steps, then the models averaged in a round).
The async-only knobs (staleness-aware rates, a staleness compensation other than the default, ``useLocking``, ``overlapPull``, ``getModelFrequency`` > 1) are refused
with sync and LocalSGD rather than ignored (:meth:`TrainingMode.problems`), so a sync mode is always
plain Sync; LocalSGD is refused with ``useAsync``, and its other fields without ``localSGDSteps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from elasticps.api.spec import StalenessCompensation, Strategy, TrainingJobSpec, TrainingSpec


OVERLAP_PULL_SYNC = "needs useAsync: true (a sync worker always starts its pull as the round commits)"
COMPENSATION_SYNC = "needs useAsync: true (a round's gradients are never stale)"
LOCAL_SGD_ONLY = "needs localSGDSteps > 0 (LocalSGD)"
LOCAL_SGD_SYNC = "LocalSGD averages models in rounds: it cannot be combined with useAsync"


class UpdateRule(str, Enum):
    """How a PS shard turns pushed gradients into model versions."""

    SYNC = "sync"  # average grads_to_wait current gradients into one update
    ASYNC = "async"  # apply every gradient at once
    LOCAL_SGD = "localsgd"  # average the model deltas of one round (seed 003)


@dataclass(frozen=True)
class LocalSGD:
    """LocalSGD's period (seed 003): ``steps`` K local steps between averagings (adaptive: the
    first K), ``warmup_steps`` with K = 1 first, ``adaptive`` K from loss and learning rate."""

    steps: int = 0  # 0: not LocalSGD
    warmup_steps: int = 0
    adaptive: bool = False
    inf_loss: float = 0.0


@dataclass(frozen=True)
class TrainingMode:
    """What a job trains with. ``pull_every``: the worker pulls every k steps (SSP when > 1);
    ``overlap_pull``: async and SSP pulls leave with the push before them (``worker/steps.py``)."""

    rule: UpdateRule = UpdateRule.SYNC
    staleness_lr: bool = False
    compensation: StalenessCompensation = StalenessCompensation.MOMENTUM_CORRECTION
    use_locking: bool = False
    pull_every: int = 1
    overlap_pull: bool = False
    local_sgd: LocalSGD = LocalSGD()

    @classmethod
    def of(cls, training: TrainingSpec) -> TrainingMode:
        local_sgd = LocalSGD(
            training.local_sgd_steps,
            training.local_sgd_warmup_steps,
            training.adaptive_local_sgd,
            training.local_sgd_inf_loss,
        )
        if training.use_async:
            rule = UpdateRule.ASYNC  # with localSGDSteps, refused by problems()
        else:
            rule = UpdateRule.LOCAL_SGD if local_sgd.steps > 0 else UpdateRule.SYNC
        return cls(
            rule=rule,
            staleness_lr=training.lr_staleness_modulation,
            compensation=training.staleness_compensation,
            use_locking=training.use_locking,
            pull_every=training.get_model_frequency,
            overlap_pull=training.overlap_pull,
            local_sgd=local_sgd,
        )

    @property
    def rounds(self) -> bool:
        """Whether the coordinator decides rounds (sync and LocalSGD) rather than every push applying."""
        return self.rule is not UpdateRule.ASYNC

    @property
    def label(self) -> str:
        """``status.mode`` and the MODE column: Sync, LocalSGD<K> or LocalSGDAdaptive, or Async
        with +StalenessLR, +Uncompensated (no staleness compensation) and +SSP<k>."""
        if self.rule is UpdateRule.SYNC:
            return "Sync"  # problems() refuses every async-only knob with sync
        if self.rule is UpdateRule.LOCAL_SGD:
            return "LocalSGDAdaptive" if self.local_sgd.adaptive else f"LocalSGD{self.local_sgd.steps}"
        parts = [self.rule.value.capitalize()]
        if self.staleness_lr:
            parts.append("StalenessLR")
        if self.compensation is StalenessCompensation.NONE:
            parts.append("Uncompensated")
        if self.pull_every > 1:
            parts.append(f"SSP{self.pull_every}")
        return "+".join(parts)

    def optimizer_problem(self, optimizer: str) -> str | None:
        """Why the model's optimizer (its PS name: sgd, adam, ...) cannot train this mode, or None:
        adaptive LocalSGD's K follows one global learning rate, which only SGD has (seed 003)."""
        if self.rule is UpdateRule.LOCAL_SGD and self.local_sgd.adaptive and optimizer != "sgd":
            return f"adaptiveLocalSGD needs an SGD optimizer (K follows its learning rate), the model's is {optimizer}"
        return None

    def tables_problem(self, served_tables: bool) -> str | None:
        """Why a model with embedding tables served from the PS cannot train this mode, or None:
        the tables are trained by pushed gradients (sync, async), while LocalSGD averages whole
        models every few steps."""
        if served_tables and self.rule is UpdateRule.LOCAL_SGD:
            return (
                "embedding tables on the PS are trained by pushed gradients (sync, async); "
                "LocalSGD averages whole models every few steps: drop spec.training.localSGDSteps"
            )
        return None

    def problems(self) -> list[tuple[str, str]]:
        """Combinations that cannot run, as (field, why), the field in the spec's spelling."""
        found: list[tuple[str, str]] = []
        local = self.local_sgd
        if local.steps == 0:
            for name, given in (
                ("localSGDWarmupSteps", local.warmup_steps > 0),
                ("adaptiveLocalSGD", local.adaptive),
                ("localSGDInfLoss", local.inf_loss != 0.0),
            ):
                if given:
                    found.append((name, LOCAL_SGD_ONLY))
        if self.rule is UpdateRule.ASYNC:
            if local.steps > 0:
                found.append(("localSGDSteps", LOCAL_SGD_SYNC))
            return found
        if self.staleness_lr:
            # Accepted gradients in sync mode are current; modulation would silently do nothing.
            found.append(("lrStalenessModulation", "needs useAsync: true"))
        if self.compensation is not TrainingMode.compensation:
            found.append(("stalenessCompensation", COMPENSATION_SYNC))
        if self.use_locking:
            found.append(("useLocking", "needs useAsync: true (sync already applies one update at a time)"))
        if self.overlap_pull:
            found.append(("overlapPull", OVERLAP_PULL_SYNC))
        if self.pull_every > 1:
            found.append(("getModelFrequency", "needs useAsync: true (local steps between pulls are asynchronous SGD)"))
        return found



def mode_label(spec: TrainingJobSpec) -> str:
    """``status.mode``, the MODE column and the run's first line: the training mode under the PS
    strategy (Sync, Async, LocalSGD4 ...), the decentralized rule otherwise (Decentralized,
    Decentralized-backup1-skip10 ...)."""
    if spec.strategy is Strategy.DECENTRALIZED:
        return spec.decentralized.label
    return TrainingMode.of(spec.training).label
