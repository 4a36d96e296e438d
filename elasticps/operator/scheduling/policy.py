"""What a scheduling policy answers: the decoration of one replica's pod and the job's group objects.

Callers: ``rendering`` asks the policy of a job (``registry.policy_for``) for each pod it renders
and for the group objects to create before the job's pods and delete when the job finishes;
``manifests`` merges a :class:`PodDecoration` into the pod (see ``manifests.pod_manifest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob


@dataclass(frozen=True)
class PodDecoration:
    """What a policy adds to one replica's pod. Empty (the default) leaves the pod as rendered.

    ``scheduler_name``: the pod's ``spec.schedulerName`` (empty: the template's, or the cluster's
    default). ``labels`` and ``annotations`` go over the template's (the operator's own labels still
    win). ``scheduling_gates``: names of ``spec.schedulingGates`` the pod is created with, after the
    template's; the pod waits unscheduled until whoever admits it removes them. ``node_selector``
    goes over the template's; ``tolerations`` are added to the template's (a queue's flavor: the
    nodes its quota is on).
    """

    scheduler_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    scheduling_gates: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)

    def joined(self, other: PodDecoration) -> PodDecoration:
        """This decoration with ``other`` on top (its scheduler name, labels, selector win)."""
        return PodDecoration(
            scheduler_name=other.scheduler_name or self.scheduler_name,
            labels={**self.labels, **other.labels},
            annotations={**self.annotations, **other.annotations},
            scheduling_gates=(*self.scheduling_gates, *(g for g in other.scheduling_gates if g not in self.scheduling_gates)),
            node_selector={**self.node_selector, **other.node_selector},
            tolerations=(*self.tolerations, *(t for t in other.tolerations if t not in self.tolerations)),
        )


@dataclass(frozen=True)
class GroupObject:
    """A job-level object a policy needs while the job runs, e.g. a PodGroup for gang scheduling.

    ``plural``: its resource name in the API (``podgroups``); ``manifest``: the object with its
    ``apiVersion``, ``kind``, ``metadata.name`` and ``spec``. The operator adds the namespace, the
    job's label and its ownerReference (``manifests.group_manifest``), creates it before the job's
    pods and deletes it once the job finished (and the garbage collector with the job).
    It is created, never updated: what it says must hold for the job's whole life.
    """

    plural: str
    manifest: Mapping[str, Any] = field(hash=False)

    @property
    def api_version(self) -> str:
        return str(self.manifest["apiVersion"])

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


class Policy(Protocol):
    """One scheduling integration (Kueue admission, a gang scheduler ...): pure, built once."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        """The decoration of replica ``index`` of ``role``'s pod."""
        ...

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        """The job-level objects created with the job's pods (none: an empty tuple)."""
        ...
