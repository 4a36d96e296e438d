"""Each worker of a local run held to a fixed share of the CPU, as if it ran on a machine of its own.

On one small machine the workers of ``elasticps run`` share its cores: a worker that sleeps (a
straggler made by ``spec.training.slowdown``) hands its CPU time to the others, so a slow worker
costs the job far less than it would on a cluster, where its node's cores stay its own. A benchmark
of stragglers caps each worker instead: its own cgroup (the cgroup v1 ``cpu`` controller) with a
CFS quota of ``cores`` CPUs, so what a sleeping worker does not use is not used.

The caps are taken as the run goes: :meth:`CpuCaps.hold` moves every worker named by a pid file of
the run directory (``<job>-worker-<i>.pid``, written by the local runner, replaced when a worker is
restarted) into its group, and is called at every poll. Needs root and a mounted ``cpu`` hierarchy;
:func:`unavailable` says why not.
"""

from __future__ import annotations

import os
from pathlib import Path

CPU_HIERARCHY = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def own_group(root: Path = CPU_HIERARCHY) -> Path:
    """This process's group in the ``cpu`` hierarchy at ``root``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return root / path.lstrip("/")
    return root


def unavailable(root: Path = CPU_HIERARCHY) -> str | None:
    """Why workers cannot be capped here (None: they can)."""
    if not (root / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {root}"
    group = own_group(root)
    if not os.access(group, os.W_OK):
        return f"{group} is not writable (run as root)"
    return None


class CpuCaps:
    """Worker processes of one run directory, each held to ``cores`` CPUs in a cgroup of its own
    under ``<this process's group>/<name>``; :meth:`close` removes the groups."""

    def __init__(self, cores: float, name: str, root: Path = CPU_HIERARCHY) -> None:
        if cores <= 0:
            raise ValueError(f"cores must be > 0, got {cores}")
        self._quota_us = max(1000, round(cores * PERIOD_US))
        self._base = own_group(root) / name
        self._held: dict[str, int] = {}  # worker -> the pid moved into its group

    def hold(self, run_dir: Path) -> None:
        """Moves each worker of ``run_dir`` not yet held (new, or restarted) into its group."""
        for pid_file in sorted(run_dir.glob("*-worker-*.pid")):
            worker = pid_file.stem
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue  # being written
            if self._held.get(worker) == pid:
                continue
            group = self._base / worker
            group.mkdir(parents=True, exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{self._quota_us}\n")
            try:
                (group / "cgroup.procs").write_text(f"{pid}\n")
            except ProcessLookupError:
                continue  # it exited already
            self._held[worker] = pid

    @property
    def held(self) -> dict[str, int]:
        return dict(self._held)

    def close(self) -> None:
        """Removes the groups (their processes, if any are left, go back to the parent group)."""
        if not self._base.exists():
            return
        parent = self._base.parent / "cgroup.procs"
        for group in sorted(self._base.iterdir()):
            if not group.is_dir():
                continue
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    parent.write_text(f"{pid}\n")
                except ProcessLookupError:
                    pass
            group.rmdir()
        self._base.rmdir()
