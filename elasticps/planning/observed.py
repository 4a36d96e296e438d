"""What an executor observed of one job, in the planner's terms: pure data.

Callers: the operator's ``observing`` (pods, Services and NetworkPolicies as the API server listed
them) and the local runner (its processes), which both fill an :class:`Observed` per pass; the
planner's rules read it. A replica is an :class:`ObservedPod` whichever executor runs it: a pod in
a cluster, a process on this machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from elasticps.api.replicas import Role


class PodPhase(str, Enum):
    """A replica's phase, with Kubernetes' pod phases as the vocabulary."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


# A replica in one of these may still run (or start): it counts as active, and is stopped on cleanup.
RUNNING_PHASES = (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.UNKNOWN)


@dataclass(frozen=True)
class ObservedPod:
    """One replica of the job, as the executor read it (fresh each pass, not from a lagging cache).

    ``exit_code``: the replica's exit code once it ended, when it has one (a pod's ``elasticps``
    container's terminated exit code; a process's return code, negative for a signal).
    ``reason``/``message``: why it failed or cannot be scheduled (pod status reason, or the
    PodScheduled condition's reason and message). ``unschedulable_since``: the PodScheduled=False
    (reason Unschedulable) condition's lastTransitionTime, as epoch seconds. ``cannot_start_since``:
    when a scheduled pod's container has been waiting on an error it will not get out of by itself
    (ErrImagePull, ImagePullBackOff, CreateContainerConfigError, ...; the reason and the kubelet's
    message go in ``reason``/``message``). ``deleted``: it is being stopped (a deletionTimestamp, a
    process sent SIGTERM). ``ready``: its Ready condition is True. ``uid``: tells a replacement from
    the replica it replaces (optional).
    """

    name: str
    role: Role
    index: int
    phase: PodPhase
    exit_code: int | None = None
    reason: str = ""
    unschedulable_since: float | None = None
    deleted: bool = False
    message: str = ""
    ready: bool = False
    uid: str = ""
    cannot_start_since: float | None = None


@dataclass(frozen=True)
class ObservedService:
    name: str


@dataclass(frozen=True)
class JobProgress:
    """What PS 0's coordinator said (``GetJobStatus``); ``progress`` is records done / records total.

    ``shard_versions``: every PS shard's model version, PS 0 first (empty: not known).
    ``live_workers``: workers the coordinator heard from within the task timeout (0: not known).
    ``grads_to_wait``: sync, the gradients averaged into the current round (0: not known, or async).
    ``shard_problem``: why the shards disagree or lost their model, in the coordinator's words
    (empty: they agree).
    ``export_path``, ``export_version``, ``export_final``: where the newest export of the model
    (``spec.output``) went, its version and whether it is the final model (empty path: none yet).
    ``records_predicted`` of ``prediction_records``, written under ``predictions_path``
    (``spec.prediction``; empty path: the job does not predict).
    ``export_error``: the coordinator gave up on an export the output refused every attempt (why,
    in its words; empty: no such failure).
    ``iterations``: a decentralized job's workers, their lowest and highest iteration (None: not
    known, or the PS strategy).
    """

    finished: bool
    model_version: int
    progress: float
    epoch: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)
    shard_versions: tuple[int, ...] = ()
    live_workers: int = 0
    grads_to_wait: int = 0
    shard_problem: str = ""
    export_path: str = ""
    export_version: int = -1
    export_final: bool = False
    records_predicted: int = 0
    prediction_records: int = 0
    predictions_path: str = ""
    export_error: str = ""
    iterations: tuple[int, int] | None = None  # decentralized: the lowest and highest of the workers' iterations
    health: str = ""  # what the training loss says: "" (learning), "Diverged" or "Stalled"
    health_message: str = ""  # why, in the coordinator's words
    last_rollback: str = ""  # what the coordinator's latest rollback undid ("": none since it started)
    checkpoint_failure: str = ""  # the shards' failing checkpoint writes ("": none is failing)
    unrecoverable: str = ""  # the shards cannot be brought to one version: the job fails with this

    @property
    def version(self) -> int:
        """The model's version: the oldest shard's when the shards are known (a shard behind the
        others has not applied the later updates), else the coordinator's own. A shard that did not
        answer (-1) is left out."""
        answered = [v for v in self.shard_versions if v >= 0]
        return min(answered) if answered else self.model_version


@dataclass(frozen=True)
class Admission:
    """What the cluster's queue (Kueue) says of a job that asked to be admitted: pure data, read
    from the job's Workload by the operator (the local runner queues nothing: no Admission at all).

    ``requested``: the job's request (its Workload) exists. ``admitted``: the queue admitted it
    (quota reserved, every admission check passed). ``counts``: the replicas admitted per role
    (fewer workers than asked under partial admission). ``holds_quota``: the queue still counts
    the job against its quota (after an eviction, until the job says its pods are gone).
    ``evicted``: why the queue took the admission back ("": it did not). ``waiting``: why the job
    is not admitted, in the queue's words. ``finished``: the queue was told the job ended.
    """

    queue: str
    requested: bool = False
    admitted: bool = False
    counts: Mapping[Role, int] = field(default_factory=dict)
    holds_quota: bool = False
    evicted: str = ""
    waiting: str = ""
    finished: bool = False
    cluster_queue: str = ""


@dataclass(frozen=True)
class Observed:
    """One observation of a job. ``status`` is the job's ``.status`` as read (what earlier passes
    wrote); ``coordinator`` is None when PS 0 did not answer; ``now`` is epoch seconds.

    ``services`` and ``network_policies``: the names of the job's Services and NetworkPolicies, or
    None where the executor has none to observe (the local runner: processes dial 127.0.0.1 ports;
    an operator without RBAC to list NetworkPolicies): the planner then neither creates nor
    expects them. ``admission``: what the cluster's queue says, for a job that is queued (None: it is
    not, or the executor has no queue)."""

    pods: tuple[ObservedPod, ...]
    services: tuple[ObservedService, ...] | None
    now: float
    coordinator: JobProgress | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    generation: int | None = None
    network_policies: tuple[str, ...] | None = None
    admission: Admission | None = None
