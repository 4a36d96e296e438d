"""The Kubernetes operator: a thin kopf adapter (to come) over the pure planner in ``planning``.

``planning.plan(job, uid, observed, settings) -> actions`` decides; ``manifests`` builds the pods and
Services it creates. Neither imports kopf or the Kubernetes client, so both are unit-tested without a
cluster; the adapter lists the job's pods and Services, asks PS 0's coordinator for progress, runs
``plan`` and executes the actions. Start it with ``kopf run -m elasticps.operator.<adapter module>``.
"""
