"""``spec.scheduling.policy: none``: the pods go to the cluster's default scheduler as rendered."""

from __future__ import annotations

from elasticps.api.replicas import Role
from elasticps.api.spec import TrainingJob
from elasticps.operator.scheduling.policy import GroupObject, PodDecoration

NOTHING = PodDecoration()


class NoPolicy:
    """Decorates nothing and creates no group: every manifest is what ``manifests`` renders."""

    def pod(self, job: TrainingJob, role: Role, index: int) -> PodDecoration:
        return NOTHING

    def groups(self, job: TrainingJob) -> tuple[GroupObject, ...]:
        return ()
