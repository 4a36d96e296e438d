"""The worker's CPUs: how many it may use (a cgroup quota caps its affinity), and its exit line: its
CPU per 1,000 training examples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticps.worker.cpu import available_cpus, cpu_line, cpu_seconds, per_thousand, quota_cpus


@pytest.mark.parametrize(
    ("quota", "period", "cpus"),
    [
        ("max 100000\n", "", None),  # v2, no limit
        ("100000 100000\n", "", 1),
        ("150000 100000\n", "", 2),  # 1.5 CPUs: rounded up
        ("50000 100000", "", 1),  # half a CPU: still one thread
        ("400000 100000", "", 4),
        ("-1\n", "100000\n", None),  # v1, no limit
        ("200000\n", "100000\n", 2),
        ("", "", None),  # no such file
        ("garbage", "", None),
        ("0 100000", "", None),
        ("100000 0", "", None),
        ("1 2 3", "", None),
    ],
)
def test_a_cgroup_quota_is_read_as_whole_cpus(quota: str, period: str, cpus: int | None) -> None:
    assert quota_cpus(quota, period) == cpus


def test_the_quota_caps_the_affinity(tmp_path: Path) -> None:
    mine = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path) == mine  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert available_cpus(tmp_path) == 1  # a pod limited to one CPU
    (tmp_path / "cpu.max").write_text(f"{(mine + 8) * 100000} 100000\n")
    assert available_cpus(tmp_path) == mine  # a quota above the affinity does not add CPUs
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path) == 1  # cgroup v1


def test_the_line_gives_the_whole_life_and_the_steady_part_per_thousand_examples() -> None:
    line = cpu_line("worker-0", 30.0, 24.0, 60_000)
    assert line == (
        "worker-0 cpu: 30.0 s for 60000 training examples (0.500 s per 1,000); "
        "from the first task 24.0 s (0.400 s per 1,000)"
    )


def test_without_examples_or_a_first_task_the_line_says_so() -> None:
    assert per_thousand(5.0, 0) is None
    assert cpu_line("worker-1", 5.0, None, 0) == "worker-1 cpu: 5.0 s for 0 training examples (- s per 1,000)"


def test_cpu_seconds_grow_with_work() -> None:
    before = cpu_seconds()
    total = 0
    while cpu_seconds() <= before:  # at most a clock tick of busy work
        total += sum(range(10_000))
    assert cpu_seconds() > before >= 0
