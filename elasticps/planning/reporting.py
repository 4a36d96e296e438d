"""What every status patch reports of the observation: replica counts, readiness, the training mode
and the coordinator's progress (the model version, the oldest shard's when the shards are known,
every shard's version, the live workers, for a sync job the gradients a round averages, and where
the newest export of the model went, ``status.output``; how many records were predicted, and where,
``status.predictions``).

Callers: ``plan``, at the end of every pass (finished jobs included: the counts stay true).
"""

from __future__ import annotations

import math
from typing import Any

from elasticps.api.modes import mode_label
from elasticps.api.replicas import Role
from elasticps.planning.draft import Draft
from elasticps.planning.observed import RUNNING_PHASES, PodPhase
from elasticps.planning.progress import sync_rounds
from elasticps.planning.roles import job_roles, selector


def observed_fields(d: Draft) -> dict[str, Any]:
    fields: dict[str, Any] = {"mode": mode_label(d.job.spec)}
    counts: dict[str, dict[str, int]] = {}
    ready: dict[Role, int] = {}
    # PS and workers always (the columns read them); a decentralized job's coordinator besides.
    for role in (Role.PS, Role.WORKER, *(r for r in job_roles(d.job) if r is Role.COORDINATOR)):
        pods = [p for p in d.pods if p.role is role]
        counts[role.value] = {
            "active": sum(p.phase in RUNNING_PHASES and not p.deleted for p in pods),
            "succeeded": sum(p.phase is PodPhase.SUCCEEDED for p in pods),
            "failed": sum(p.phase is PodPhase.FAILED for p in pods),
        }
        ready[role] = sum(p.ready and p.phase is PodPhase.RUNNING and not p.deleted for p in pods)
    fields["replicaStatuses"] = counts
    fields["readyWorkers"] = ready[Role.WORKER]
    fields["workers"] = f"{ready[Role.WORKER]}/{d.desired(Role.WORKER)}"
    fields["ps"] = f"{ready[Role.PS]}/{d.desired(Role.PS)}"
    fields["workerSelector"] = selector(d.job, Role.WORKER)
    if d.obs.generation is not None:
        fields["observedGeneration"] = d.obs.generation
    coordinator = d.obs.coordinator
    if coordinator is not None:
        fields["modelVersion"] = coordinator.version  # the oldest shard's, when the shards are known
        if coordinator.shard_versions and d.job.uses_ps:
            fields["shardVersions"] = list(coordinator.shard_versions)
        fields["liveWorkers"] = coordinator.live_workers
        rounds = sync_rounds(d.job, coordinator)
        if rounds is not None:
            fields["gradsToWait"] = rounds.averaged
        elif "gradsToWait" in d.obs.status:
            fields["gradsToWait"] = None  # the job turned async: no round averages anything
        if coordinator.iterations is not None and not d.job.uses_ps:
            low, high = coordinator.iterations
            fields["iterations"] = f"{low}-{high}"
        fields["epoch"] = coordinator.epoch
        fraction = min(max(coordinator.progress, 0.0), 1.0) if math.isfinite(coordinator.progress) else 0.0
        fields["progress"] = f"{math.floor(fraction * 100)}%"
        # JSON has no NaN (a loss before the first task): such metrics are left out.
        fields["metrics"] = {k: float(v) for k, v in coordinator.metrics.items() if math.isfinite(v)}
        if coordinator.export_path:
            fields["output"] = {
                "path": coordinator.export_path,
                "modelVersion": coordinator.export_version,
                "final": coordinator.export_final,
            }
        if coordinator.predictions_path:
            fields["predictions"] = {
                "path": coordinator.predictions_path,
                "records": coordinator.records_predicted,
                "total": coordinator.prediction_records,
            }
    return fields
