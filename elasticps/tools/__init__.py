"""Command-line helpers around a job's data, run as ``python -m elasticps.tools.<name>``."""
