"""The worker's CPUs: how many it may use (its TensorFlow thread pools' size), and the CPU seconds
per 1,000 training examples it logs at exit.

:func:`available_cpus`: the CPUs this process may run on (its affinity), capped by its cgroup's CPU
quota (a pod's CPU limit: ``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` of
v1), rounded up. TensorFlow sizes its pools by the machine's CPUs and knows nothing of the quota, so
a worker limited to 1 CPU on a 64-core node would otherwise run 64 threads in a 1-CPU budget.

``worker/main.py`` reads :func:`cpu_seconds` at start-up and when the first training task begins
(``training.py`` marks it), and logs :func:`cpu_line` at the end: the figure over the whole life
(TensorFlow's import and the first traces included) and from the first task on (the steady cost of
training). Every thread of the process counts: the gradient computation's thread pools as much as
the pushes and pulls. Evaluation tasks are included; only training examples are counted.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def quota_cpus(quota: str, period: str = "") -> int | None:
    """CPUs of a cgroup quota, rounded up: v2's ``cpu.max`` text (``"150000 100000"``, or
    ``"max 100000"``: none) as ``quota``; v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``
    texts (quota -1: none) as ``quota`` and ``period``. None without a quota or for text that is not one."""
    fields = quota.split() + period.split()
    if len(fields) != 2 or fields[0] in ("max", "-1"):
        return None
    try:
        allowed, each = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if allowed <= 0 or each <= 0:
        return None
    return max(1, math.ceil(allowed / each))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def available_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's quota when it has one."""
    cpus = len(os.sched_getaffinity(0))
    quota = quota_cpus(_read(cgroup / "cpu.max"))
    if quota is None:
        quota = quota_cpus(_read(cgroup / "cpu" / "cpu.cfs_quota_us"), _read(cgroup / "cpu" / "cpu.cfs_period_us"))
    return cpus if quota is None else max(1, min(cpus, quota))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_thousand(seconds: float, examples: int) -> float | None:
    """Seconds per 1,000 examples; None without examples."""
    return seconds / examples * 1000 if examples > 0 else None


def cpu_line(name: str, total_s: float, since_first_task_s: float | None, examples: int) -> str:
    """One line: the CPU of the whole life and from the first training task on, each per 1,000 examples."""

    def rate(seconds: float) -> str:
        value = per_thousand(seconds, examples)
        return "-" if value is None else f"{value:.3f}"

    line = f"{name} cpu: {total_s:.1f} s for {examples} training examples ({rate(total_s)} s per 1,000)"
    if since_first_task_s is not None:
        line += f"; from the first task {since_first_task_s:.1f} s ({rate(since_first_task_s)} s per 1,000)"
    return line
