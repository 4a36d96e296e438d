"""The Kubernetes operator: a thin kopf adapter over the pure planner in ``elasticps.planning``.

``elasticps.planning.plan.plan(job, observed, settings, check) -> actions`` decides (the same
planner the local runner executes); ``rendering`` turns its replica actions into Pods, Services
and a NetworkPolicy built by ``manifests``, decorated by the job's scheduling policy
(``scheduling``: scheduler name, labels, gates, a group object such as a PodGroup). None of them
imports kopf or the Kubernetes client, so all are unit-tested without a cluster. The adapter around them:

- ``handlers``: the kopf handlers, mere triggers (job created/resumed/changed, a pod of a job changed);
- ``queueing``: one pass at a time per job, bursts of events coalesced, an idle-aware resync;
- ``reconciling``: one pass (read the job, its pods and Services fresh, ask PS 0 via ``probing``,
  turn what was read into ``Observed`` via ``observing``, plan, render);
- ``executing``: the actions carried out in the planner's order, Events about each pod;
- ``cluster_api``: the few API calls, as JSON, over the official client; ``counting`` counts them;
- ``config``, ``runtime``, ``main``: ``elasticps operator`` (flags -> config -> kopf).

Start it with ``elasticps operator`` or ``kopf run -m elasticps.operator.handlers --all-namespaces``.
"""
