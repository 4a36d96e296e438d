"""``elasticps run``: a TrainingJob on this machine, the planner's replicas as local processes.

``runner`` (the loop: observe, plan, execute), ``fleet`` (replicas as processes and back as
observations), ``executing`` (actions to starts and stops), ``processes`` (start/stop one),
``progress`` (what a person sees), ``results`` (the summary and ``--result_file``), ``ports``
(free loopback ports).
"""
