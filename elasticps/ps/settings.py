"""The frozen configuration of one parameter-store shard.

Built once per process by ``ps/main.py`` (from the parsed flags) and by tests; read by the store,
the update-rule registry (``rules.py``) and the checkpoint schedule (``checkpointing.py``). The
training mode arrives whole, as ``api.modes.TrainingMode``: nothing on the PS reads the spec's
mode flags, the registry picks a rule from ``mode.rule``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from elasticps.api.modes import TrainingMode
from elasticps.api.row_policy import RowPolicies


@dataclass(frozen=True)
class StoreSettings:
    shard: int = 0
    mode: TrainingMode = field(default_factory=TrainingMode)
    sync_version_tolerance: int = 0  # sync: how many versions behind a gradient may be
    checkpoint_dir: Path | None = None  # this shard writes under <checkpoint_dir>/ps-<shard>
    checkpoint_steps: int = 0  # a checkpoint every this many versions (0: never)
    keep_checkpoint_max: int = 3
    checkpoint_full_every: int = 0  # > 1: one whole checkpoint in this many, the others deltas of it
    round_log: Path | None = None  # sync: every commit's minibatches appended here (JSON lines; audits)
    row_policies: RowPolicies = field(default_factory=RowPolicies)  # which rows each embedding table keeps
