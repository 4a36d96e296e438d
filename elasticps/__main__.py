"""``python -m elasticps``: the same as the ``elasticps`` command (the local runner starts replicas so)."""

from elasticps.cli import main

raise SystemExit(main())
