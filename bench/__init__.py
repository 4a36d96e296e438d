"""Benchmarks of elasticps (``make bench``): the PS data path against raw TCP on loopback."""
