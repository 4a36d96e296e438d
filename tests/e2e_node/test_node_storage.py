"""Storage faults on the real node (issue 35): a sync job with 2 PS checkpointing to the node's
disk (hostPath). PS 1's process is stopped, its newest checkpoint truncated and the one before
given a flipped byte, and it is killed: the job ends Succeeded from the newest version both shards
read. PS 1's checkpoint folder is a small filesystem that fills up: CheckpointFailing shows in
kubectl; PS 1 killed once PS 0 wrote more versions than it keeps: every shard kept the newest
version all of them can restore, and the job rolls back to it and ends Succeeded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from node_kit import CACHE, Kubectl, mnist_job, report, wait_for
from elasticps.ps import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.node]


def storage_job(name: str, data: Path, folder: Path, mount: str, keep: int, epochs: int = 2) -> dict[str, Any]:
    job = mnist_job(
        name, data, epochs=epochs,
        ps_volumes=[{"name": "ckpt", "hostPath": {"path": str(folder), "type": "Directory"}}],
        ps_mounts=[{"name": "ckpt", "mountPath": mount}],
        training={"checkpointDir": mount, "checkpointSteps": 10, "keepCheckpointMax": keep},
    )  # fmt: skip
    job["spec"]["ps"]["replicas"] = 2
    return job


def versions(directory: Path) -> list[int]:
    return [v for v in (checkpoint.version_of(p) for p in checkpoint.list_checkpoints(directory)) if v is not None]


def ps_process(mount: str, shard: int) -> int:
    """The host pid of the job's PS ``shard`` (its command line names the job's own checkpoint mount)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--checkpoint_dir={mount}".encode() in args and f"--ps_id={shard}".encode() in args:
            return int(entry.name)
    raise AssertionError(f"no process of PS {shard} with --checkpoint_dir={mount}")


def conditions(kubectl: Kubectl, ns: str, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in kubectl.job(ns, name).get("status", {}).get("conditions", [])}


def phase(kubectl: Kubectl, ns: str, name: str) -> str:
    found = kubectl.job(ns, name).get("status", {}).get("phase", "")
    return found if found in ("Succeeded", "Failed") else ""


@pytest.mark.timeout(1500)
def test_corrupt_newest_checkpoints_then_a_killed_ps_the_job_succeeds(kubectl: Kubectl, ns: str, data: Path) -> None:
    name, mount = "corrupt", f"/ckpt-{ns}"
    folder = CACHE / "node-checkpoints" / ns
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)  # the PS runs as uid 1000
    kubectl.apply(ns, storage_job(name, data, folder, mount, keep=5))  # PS 0 may be a checkpoint ahead
    ps1 = folder / "ps-1"
    wait_for(lambda: len(versions(ps1)) >= 3, 600, "PS 1's third checkpoint", interval=0.5)
    pid = ps_process(mount, 1)
    os.kill(pid, signal.SIGSTOP)
    held = versions(ps1)
    newest, before = (checkpoint.path_of(ps1, v) for v in held[:2])
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    flipped = bytearray(before.read_bytes())
    flipped[-40] ^= 0x01
    before.write_bytes(bytes(flipped))
    os.kill(pid, signal.SIGKILL)
    print(f"\nPS 1 killed with checkpoints {held}: {held[0]} truncated, {held[1]} flipped", file=sys.stderr)
    finished = wait_for(lambda: phase(kubectl, ns, name), 900, f"{name} to finish", interval=2)
    status = kubectl.job(ns, name)["status"]
    report(f"PS 1's newest checkpoints spoilt ({held[0]} truncated, {held[1]} flipped), PS 1 killed",
           kubectl.show(ns), status)  # fmt: skip
    assert finished == "Succeeded", status
    assert status["progress"] == "100%"
    rolled = conditions(kubectl, ns, name)["RolledBack"]["message"]
    print(f"RolledBack: {rolled}", file=sys.stderr)
    assert f"to {held[2]};" in rolled


@pytest.mark.timeout(1500)
def test_a_full_disk_is_said_in_kubectl_and_a_ps_killed_long_after_rolls_back_to_the_version_every_shard_kept(
    kubectl: Kubectl, ns: str, big_data: Path
) -> None:
    name, mount = "fulldisk", f"/ckpt-{ns}"
    folder = CACHE / "node-checkpoints" / ns
    ps1 = folder / "ps-1"
    ps1.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0777", "tmpfs", str(ps1)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem: {mounted.stderr.strip()}")
    try:
        # The whole of MNIST (469 rounds an epoch): PS 0 writes many versions past PS 1's last.
        kubectl.apply(ns, storage_job(name, big_data, folder, mount, keep=3, epochs=1))
        wait_for(lambda: len(versions(ps1)) >= 1, 600, "PS 1's first checkpoint", interval=0.5)
        try:
            with (ps1 / "filler").open("wb") as filler:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
        except OSError:
            pass  # full
        last = versions(ps1)[0]
        failing = wait_for(lambda: conditions(kubectl, ns, name).get("CheckpointFailing"), 300,
                           "condition CheckpointFailing", interval=1)  # fmt: skip
        print(f"\nCheckpointFailing: {failing['message']}", file=sys.stderr)
        assert failing["status"] == "True" and "No space left on device" in failing["message"]
        ps0 = folder / "ps-0"
        wait_for(lambda: versions(ps0)[3:4] == [last], 600, f"PS 0 to write 3 versions past {last}", interval=1)
        kept = versions(ps0)
        os.kill(ps_process(mount, 1), signal.SIGKILL)
        killed = time.monotonic()
        finished = wait_for(lambda: phase(kubectl, ns, name), 600, f"{name} to finish", interval=0.5)
        took = time.monotonic() - killed
        status = kubectl.job(ns, name)["status"]
        report(f"PS 1's disk full after version {last}, PS 0 kept {kept} (keep 3), PS 1 killed: {finished} "
               f"{took:.1f} s later", kubectl.show(ns), status)  # fmt: skip
        assert finished == "Succeeded", status
        assert last in kept  # past the 3 newest, kept: the newest version every shard can restore
        rolled = conditions(kubectl, ns, name)["RolledBack"]
        print(f"RolledBack: {rolled['message']}", file=sys.stderr)
        assert f"to {last};" in rolled["message"]
        assert status["progress"] == "100%"
    finally:
        kubectl("delete", "trainingjob", name, "-n", ns, "--wait=false", check=False)
        time.sleep(5)
        subprocess.run(["umount", "-l", str(ps1)], check=False)
