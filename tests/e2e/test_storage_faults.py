"""Storage faults under `elasticps run` (issue 35): a sync job's PS 1 loses its newest checkpoints
(truncated, one byte flipped, deleted) or its disk fills up, and is then killed -9. The job either
ends Succeeded from the newest version every shard and the ledger can read, with every record
trained once per epoch, or Failed with a one-line reason within 60 s; it never hangs. A full disk
ends Succeeded too: every shard keeps the newest version all of them can restore.

Before: the coordinator asked the restarted shard to restore a version whose file was truncated,
350 times in 3 minutes; a shard that came back at a version no other shard held had every round
aborted until the job was stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from local_jobs import elasticps, job_document, stop_run, wait_for, write_data, write_job
from elasticps.ps import checkpoint

pytestmark = pytest.mark.slow

RECORDS = 6000
NAME = "storage"


def start(tmp_path: Path, run_dir: Path, epochs: int = 2) -> subprocess.Popen[str]:
    train, validation = write_data(tmp_path, records=RECORDS)
    job = write_job(tmp_path / "job.yaml", job_document(NAME, train, validation, checkpointSteps=10, keepCheckpointMax=5,
                                                        numEpochs=epochs))  # fmt: skip
    return elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(tmp_path / "result.json"),
                     cwd=tmp_path)  # fmt: skip


def versions(directory: Path) -> list[int]:
    return [v for v in (checkpoint.version_of(p) for p in checkpoint.list_checkpoints(directory)) if v is not None]


def pid(run_dir: Path, replica: str) -> int:
    return int((run_dir / f"{NAME}-{replica}.pid").read_text())


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # a byte of the last array
    path.write_bytes(bytes(data))


def delete(path: Path) -> None:
    path.unlink()


FAULTS: dict[str, list[Callable[[Path], None]]] = {
    "the newest truncated": [truncate],
    "the newest with a flipped byte": [flip],
    "the newest missing": [delete],
    "the newest truncated and the one before flipped": [truncate, flip],  # Found 4 of the issue
}


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_run(process)
        pytest.fail(f"the job did not end within {timeout:.0f} s (a hang)")
    return process.returncode, stderr


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_shard_whose_newest_checkpoints_are_bad_is_rolled_back_to_one_every_shard_reads(
    tmp_path: Path, fault: str
) -> None:
    run_dir = tmp_path / "run"
    process = start(tmp_path, run_dir)
    ps1 = run_dir / "checkpoints" / "ps-1"
    try:
        wait_for(lambda: len(versions(ps1)) >= 3, 240, "PS 1's third checkpoint")
        victim = pid(run_dir, "ps-1")
        os.kill(victim, signal.SIGSTOP)  # no more writes while its files are spoilt
        held = versions(ps1)
        for spoil, version in zip(FAULTS[fault], held):
            spoil(checkpoint.path_of(ps1, version))
        good = held[len(FAULTS[fault])]
        os.kill(victim, signal.SIGKILL)
        code, stderr = finish(process, 300)
    finally:
        stop_run(process)
    assert code == 0, stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epoch_records"] == [RECORDS, RECORDS]  # every record trained once per epoch
    ps0_log = (run_dir / f"{NAME}-ps-0.log").read_text()
    assert f"every shard and the task ledger rolled back to version {good} " in ps0_log, ps0_log[-2000:]
    assert "recovery after the restart of PS shards" not in ps0_log  # no refused restore, let alone 350


def mount_small_filesystem(where: Path) -> None:
    where.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")


def fill(where: Path) -> None:
    """Writes a file into ``where`` until its filesystem is full."""
    try:
        with (where / "filler").open("wb") as filler:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    except OSError:
        pass  # full


def test_a_full_disk_is_said_and_a_shard_killed_long_after_goes_back_to_the_version_every_shard_kept(
    tmp_path: Path,
) -> None:
    # Found 5 of the issue: PS 1's checkpoint folder fills up; killed later, PS 1 comes back at its
    # last checkpoint. Before, PS 0 had deleted that version by then (it keeps 5) and the job hung;
    # now every commit names the newest version all shards and the ledger can restore, and each
    # shard keeps it past keepCheckpointMax: the job rolls back to it and trains on.
    run_dir = tmp_path / "run"
    ps1 = run_dir / "checkpoints" / "ps-1"
    mount_small_filesystem(ps1)
    try:
        process = start(tmp_path, run_dir, epochs=4)  # 4: room for PS 0's 5 versions past PS 1's last
        try:
            wait_for(lambda: len(versions(ps1)) >= 1, 240, "PS 1's first checkpoint")
            fill(ps1)
            last = versions(ps1)[0]
            ps0 = run_dir / "checkpoints" / "ps-0"
            wait_for(lambda: versions(ps0)[5:6] == [last] or process.poll() is not None, 240,
                     f"PS 0 to write 5 versions past {last}")  # fmt: skip
            if process.poll() is not None:  # once in CI: said here with the job's own words
                pytest.fail(f"the job ended ({process.returncode}) before PS 0 wrote 5 versions past {last}: "
                            f"{process.communicate()[1][-3000:]}")  # fmt: skip
            kept = versions(ps0)
            os.kill(pid(run_dir, "ps-1"), signal.SIGKILL)
            code, stderr = finish(process, 240)
        finally:
            stop_run(process)
    finally:
        subprocess.run(["umount", "-l", str(ps1)], check=False)
    print(f"\nPS 1's disk full after version {last}; PS 0 kept {kept} (keepCheckpointMax 5)")
    assert "warning: CheckpointFailing: PS 1: checkpoint of version" in stderr and "No space left on device" in stderr
    assert code == 0, stderr[-3000:]
    assert kept[:5] != [last] and last in kept  # past the 5 newest, still kept: every shard can restore it
    ps0_log = (run_dir / f"{NAME}-ps-0.log").read_text()
    assert f"every shard and the task ledger rolled back to version {last} " in ps0_log, ps0_log[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epoch_records"] == [RECORDS] * 4
