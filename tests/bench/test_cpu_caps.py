"""bench.cpu_caps against the machine's real cgroup cpu hierarchy: workers named by pid files are
moved into capped groups, a restarted worker is moved again, and closing removes the groups."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cpu_caps import CpuCaps, own_group, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"cannot cap CPUs here: {unavailable()}")


def cpu_group(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"no cpu controller line for {pid}")


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def sleeper(started: list[subprocess.Popen[bytes]]) -> int:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(process)
    return process.pid


def test_workers_are_held_each_in_a_capped_group_and_released(tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first, second = sleeper(sleepers), sleeper(sleepers)
    (run_dir / "local-worker-0.pid").write_text(f"{first}\n")
    (run_dir / "local-worker-1.pid").write_text(f"{second}\n")
    (run_dir / "ps-0.pid").write_text(f"{sleeper(sleepers)}\n")  # not a worker: left alone
    name = f"elasticps-test-{tmp_path.name}"
    caps = CpuCaps(0.25, name)
    try:
        caps.hold(run_dir)
        assert caps.held == {"local-worker-0": first, "local-worker-1": second}
        assert cpu_group(first).endswith(f"/{name}/local-worker-0")
        assert cpu_group(second).endswith(f"/{name}/local-worker-1")
        assert (own_group() / name / "local-worker-0" / "cpu.cfs_quota_us").read_text().strip() == "25000"
        replaced = sleeper(sleepers)  # worker 1 restarted under a new pid
        (run_dir / "local-worker-1.pid").write_text(f"{replaced}\n")
        caps.hold(run_dir)
        assert caps.held["local-worker-1"] == replaced
        assert cpu_group(replaced).endswith(f"/{name}/local-worker-1")
    finally:
        caps.close()
    assert not (own_group() / name).exists()
    assert cpu_group(first) == cpu_group(sleepers[2].pid)  # back with the rest


def test_a_worker_that_already_exited_is_skipped(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    (tmp_path / "local-worker-0.pid").write_text(f"{process.pid}\n")
    (tmp_path / "local-worker-1.pid").write_text("")  # being written
    caps = CpuCaps(0.5, f"elasticps-test-{tmp_path.name}")
    try:
        caps.hold(tmp_path)
        assert caps.held == {}
    finally:
        caps.close()


def test_a_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cores must be > 0"):
        CpuCaps(0, "never-made")
