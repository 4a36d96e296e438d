"""Pod templates checked by the API server itself, strictly, before a job's first pod is created.

Callers: ``reconciling``, once per job generation (a spec the parser took). The CRD keeps
``spec.<role>.template`` opaque, so a key Kubernetes does not know (``nodeSelectr``) would be
dropped silently when the pod is created. Here each role's first pod, rendered as the operator
would create it, is sent once with ``dryRun=All`` and ``fieldValidation=Strict``: a refusal names
the field, and the job fails (reason InvalidSpec) before anything is created. Answers are kept per
(job uid, generation), so a job costs one request per role per edit of its spec.
"""

from __future__ import annotations

from typing import Protocol

from elasticps.api.spec import TrainingJob
from elasticps.operator.manifests import TemplateError
from elasticps.operator.rendering import Renderer
from elasticps.planning.roles import job_roles

MAX_KEPT = 4096  # answers kept; beyond, the oldest half is forgotten (asked again if needed)


class DryRunApi(Protocol):
    def dry_run_pod(self, namespace: str, manifest: dict[str, object]) -> str | None: ...


class TemplateCheck:
    def __init__(self, api: DryRunApi, renderer: Renderer) -> None:
        self._api = api
        self._renderer = renderer
        self._answers: dict[tuple[str, int | None], str | None] = {}

    def problem(self, job: TrainingJob, uid: str, generation: int | None) -> str | None:
        """Why the API server refuses a pod of ``job`` (the template's field named), or None."""
        key = (uid, generation)
        if key not in self._answers:
            if len(self._answers) >= MAX_KEPT:
                for old in list(self._answers)[: MAX_KEPT // 2]:
                    del self._answers[old]
            self._answers[key] = self._ask(job, uid)
        return self._answers[key]

    def _ask(self, job: TrainingJob, uid: str) -> str | None:
        for role in job_roles(job):
            try:
                pod = self._renderer.pod(job, uid, role, 0)
            except TemplateError:
                return None  # the planner's render check says why, in the template's own words
            refused = self._api.dry_run_pod(job.namespace, pod)
            if refused:
                return f"spec.{role.value}.template: the API server refuses the pod: {refused}"
        return None
