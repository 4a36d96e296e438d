"""The end of a job is durable on the real node: a PS killed after the last training task.

Every record of every epoch is trained and the final evaluation runs when the PS's process is
killed with SIGKILL from the host (as the OOM killer would). Its pod is replaced and restores the
newest checkpoint on a hostPath, older than the end: every shard and the task ledger roll back, the
records trained since go back to the queue, and the workers (still there, or started again by the
operator: ``planning/retraining.py``) train them again. The job must end Succeeded, each record
counted once per epoch, and never hang. The coordinator is asked directly (PS 0's pod IP from the
host) so that the kill lands inside the window, which is seconds long.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest

from elasticps.api.replicas import PS_PORT
from elasticps.coordinator.client import CoordinatorClient
from node_kit import CACHE, Kubectl, mnist_job, node_data, observer_token, record, report, wait_for
from test_node_scenarios import _finished, _host_pid, _status

pytestmark = [pytest.mark.slow, pytest.mark.node]

TRAIN, TEST = 4096, 10000  # a short training, a final evaluation of the whole test set: the window


def _coordinator(kubectl: Kubectl, ns: str, name: str) -> CoordinatorClient | None:
    pod = next((p for p in kubectl.pods(ns, name) if p["metadata"]["name"] == f"{name}-ps-0"), None)
    ip = (pod or {}).get("status", {}).get("podIP")
    if not ip:
        return None
    return CoordinatorClient(f"{ip}:{PS_PORT}", worker="node-test", token=observer_token(kubectl, ns, name))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("victim", [0, 1])
def test_a_ps_killed_after_the_last_task_still_ends_the_job(kubectl: Kubectl, ns: str, victim: int) -> None:
    name = f"mnist-end-{victim}"
    ckpt = CACHE / "node-checkpoints" / ns
    ckpt.mkdir(parents=True, exist_ok=True)
    ckpt.chmod(0o777)  # the PS runs as uid 1000
    document: dict[str, Any] = mnist_job(
        name, node_data(TRAIN, TEST), epochs=2,
        ps_volumes=[{"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}}],
        ps_mounts=[{"name": "ckpt", "mountPath": "/ckpt"}],
        training={"checkpointDir": "/ckpt", "checkpointSteps": 20, "recordsPerTask": 512},
    )  # fmt: skip
    document["spec"]["ps"]["replicas"] = 2
    t0 = time.monotonic()
    kubectl.apply(ns, document)
    found = wait_for(lambda: _coordinator(kubectl, ns, name), 300, "PS 0's pod IP", interval=0.5)
    assert found is not None
    client = found
    seen: dict[str, int] = {}

    def last_task_trained() -> bool:
        try:
            status = client.status(timeout_s=1.0)
        except Exception:  # noqa: BLE001 - PS 0 still starting
            return False
        assert not status.finished, "the job ended before the test could kill in its last window"
        seen.update(version=status.model_version, done=status.records_done)
        return status.records_total > 0 and status.records_done >= status.records_total

    try:
        wait_for(last_task_trained, 600, "every record of both epochs trained", interval=0.05)
    finally:
        client.close()
    pid = wait_for(lambda: _host_pid(f"{name}-ps-{victim}"), 30, f"PS {victim}'s process on the host", interval=0.1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic() - t0
    last: dict[str, Any] = {}

    def ended() -> str:
        """The job's phase once it ended; meanwhile the coordinator's ledger (PS 0's, replaced
        with its pod when it was the victim) as it last answered."""
        ask = _coordinator(kubectl, ns, name)
        if ask is not None:
            try:
                status = ask.status(timeout_s=1.0)
                last.update(epoch_records=list(status.epoch_records), finished=status.finished)
            except Exception:  # noqa: BLE001 - restarting, or gone with the job
                pass
            finally:
                ask.close()
        return _finished(kubectl, ns, name)

    phase = wait_for(ended, 900, f"{name} to finish", interval=0.5)
    status = _status(kubectl, ns, name)
    print(f"\n{kubectl.show(ns)}\nstatus: {status}\nthe coordinator last said: {last}", file=sys.stderr)
    what = f"ps-{victim}'s process killed (-9) after the last task, at version {seen['version']}"
    record(f"MNIST sync, {what}: apply -> {phase}", time.monotonic() - t0)
    report(f"{what} ({killed:.1f} s after apply)", kubectl.show(ns), status)
    events = kubectl.json("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    reasons = [e["reason"] for e in events]
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status
    assert status.get("restarts", 0) >= 1, status
    # Each record once per epoch, not more: the ledger as the coordinator last told it. Whether the
    # shards rolled back depends on where in the window the kill fell (a RolledBack event when they
    # did; a shard killed after the final evaluation read it is not needed again), so it is printed.
    assert last.get("epoch_records") == [TRAIN, TRAIN], last
    print(f"rolled back: {'RolledBack' in reasons}; events {reasons}", file=sys.stderr)
