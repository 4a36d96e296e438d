"""The pure planner shared by both executors: ``plan(job, observed) -> actions``.

Callers: the operator's reconcile pass (``elasticps.operator.reconciling``), which renders the
actions to Pods, Services and a NetworkPolicy, and the local runner (``elasticps.local.runner``),
which renders them to processes. Nothing in this package does I/O or reads the clock: time comes
in :attr:`observed.Observed.now`, so every rule is a table-driven unit test
(``tests/operator_planning``).

Modules, from the inputs to the composer:
- ``observed``: what an executor saw (replicas as ``ObservedPod``, the coordinator's progress);
- ``progress``: PS 0's ``GetJobStatus`` reply as the planner's ``JobProgress`` (the one conversion
  both executors use), and a sync job's rounds as it shows them;
- ``actions``: what the planner asks for (replicas by role and index, never manifests);
- ``settings``: ``PlannerSettings`` and the executor's optional render check;
- ``roles``: the roles a job's strategy has and how many replicas of each it wants;
- ``status``: ``.status`` as one pass edits it, and its merge patch;
- ``draft``: one pass under way (what it observed, what it will do);
- the rules, one family each: ``ends``, ``suspension``, ``failures``, ``stuck``, ``scaling``,
  ``phase``, ``training`` (what the coordinator says of the shards and the sync rounds), and
  ``reporting`` (the counts and progress every status carries);
- ``plan``: ``plan()`` / ``plan_invalid()``, the rules composed in their documented order.
"""
