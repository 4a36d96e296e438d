"""Faults on the real node: what users and the operator do to pods that really run.

* a worker pod deleted mid-training: its process exits on SIGTERM, the operator replaces it, the job
  still succeeds;
* the PS pod deleted mid-training with checkpointDir on a hostPath volume: the new PS restores its
  checkpoint ("resumes at version N") and the job succeeds;
* the TrainingJob deleted: every pod exits on SIGTERM (exit codes and times printed);
* async training to Succeeded;
* a sync job scaled 2 -> 4 -> 1 workers with `kubectl scale` while it trains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from node_kit import CACHE, Kubectl, mnist_job, record, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]


class Termination(threading.Thread):
    """Watches a pod (``kubectl get -w``, every update) while it is deleted and keeps the last
    container state the kubelet reported: the exit code and when the process ended, before the pod
    object disappears."""

    def __init__(self, kubectl: Kubectl, ns: str, pod: str):
        super().__init__(daemon=True)
        self.kubectl, self.ns, self.pod = kubectl, ns, pod
        self.terminated: dict[str, Any] | None = None
        self.gone_after: float | None = None
        self.t0 = time.monotonic()
        # The operator recreates a deleted pod under the same name: follow this one only.
        self.uid = kubectl.json("get", "pod", pod, "-n", ns)["metadata"]["uid"]
        self.proc = subprocess.Popen(
            ["kubectl", "get", "pod", pod, "-n", ns, "-w", "--output-watch-events", "-o", "json"],
            env=kubectl.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    def start_clock(self) -> None:
        self.t0 = time.monotonic()

    def run(self) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        assert self.proc.stdout is not None
        try:
            while True:
                chunk = self.proc.stdout.readline()
                if not chunk:
                    return
                buf += chunk
                while buf.strip():
                    try:
                        event, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    pod = event.get("object", {})
                    if pod.get("metadata", {}).get("uid") != self.uid:
                        continue
                    for c in pod.get("status", {}).get("containerStatuses", []):
                        if c["name"] == "elasticps" and "terminated" in c.get("state", {}):
                            self.terminated = c["state"]["terminated"]
                    if event.get("type") == "DELETED":
                        self.gone_after = time.monotonic() - self.t0
                        return
        finally:
            self.proc.kill()


def _status(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kubectl.job(ns, name).get("status", {})
    return found


def _finished(kubectl: Kubectl, ns: str, name: str) -> str:
    phase = str(_status(kubectl, ns, name).get("phase", ""))
    return phase if phase in ("Succeeded", "Failed") else ""


def _training(kubectl: Kubectl, ns: str, name: str) -> bool:
    return int(_status(kubectl, ns, name).get("modelVersion") or 0) > 0


def _delete_and_watch(kubectl: Kubectl, ns: str, pod: str) -> Termination:
    watch = Termination(kubectl, ns, pod)
    watch.start()
    time.sleep(1)  # the watch is established
    watch.start_clock()
    kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    watch.join(130)
    return watch


@pytest.mark.timeout(1200)
def test_worker_deleted_mid_training_is_replaced(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    name = "mnist-worker-loss"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, big_data))
    wait_for(lambda: int(_status(kubectl, ns, name).get("modelVersion") or 0) >= 40, 600,
             f"{name} to train (modelVersion >= 40 of ~469)", interval=0.5)
    watch = _delete_and_watch(kubectl, ns, f"{name}-worker-0")
    print(f"\nworker-0 deleted: terminated {watch.terminated}, pod gone after {watch.gone_after} s", file=sys.stderr)
    assert watch.terminated is not None, "the kubelet reported no terminated state for worker-0"
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    print(f"{kubectl.show(ns)}\nstatus: {status}", file=sys.stderr)
    record(f"MNIST sync, worker-0 deleted mid-training (exit {watch.terminated.get('exitCode')}): apply -> {phase}",
           time.monotonic() - t0)
    report("worker-0 deleted mid-training and replaced", kubectl.show(ns), status)
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status  # every record trained, the lost worker's task included


@pytest.mark.timeout(1200)
def test_ps_deleted_restores_from_checkpoint_on_hostpath(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    name = "mnist-ps-loss"
    ckpt = CACHE / "node-checkpoints" / ns
    ckpt.mkdir(parents=True, exist_ok=True)
    ckpt.chmod(0o777)  # the PS runs as uid 1000
    t0 = time.monotonic()
    job = mnist_job(
        name, big_data,
        ps_volumes=[{"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}}],
        ps_mounts=[{"name": "ckpt", "mountPath": "/ckpt"}],
        training={"checkpointDir": "/ckpt", "checkpointSteps": 20},
    )
    kubectl.apply(ns, job)
    wait_for(lambda: int(_status(kubectl, ns, name).get("modelVersion") or 0) >= 60, 600,
             f"{name} past its first checkpoints (modelVersion >= 60 of ~469)", interval=0.5)
    before = int(_status(kubectl, ns, name).get("modelVersion") or 0)
    watch = _delete_and_watch(kubectl, ns, f"{name}-ps-0")
    print(f"\nps-0 deleted at version {before}: terminated {watch.terminated}, gone after {watch.gone_after} s", file=sys.stderr)
    assert watch.terminated is not None and watch.terminated.get("exitCode") == 0, watch.terminated

    def resumed() -> str:
        logs = kubectl("logs", f"{name}-ps-0", "-n", ns, check=False).stdout
        return next((line for line in logs.splitlines() if "resumes at version" in line), "")

    line = wait_for(resumed, 300, "the new PS 0 to restore its checkpoint", interval=0.5)
    print(line, file=sys.stderr)
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    print(f"{kubectl.show(ns)}\nstatus: {status}", file=sys.stderr)
    record(f"MNIST sync, ps-0 deleted at version {before} and restored: apply -> {phase}", time.monotonic() - t0)
    report(f"ps-0 deleted at version {before}, restored from its checkpoint ({line.strip()})", kubectl.show(ns), status)
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status


@pytest.mark.timeout(900)
def test_deleting_the_job_stops_every_pod_with_sigterm(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    name = "mnist-delete"
    kubectl.apply(ns, mnist_job(name, big_data))
    wait_for(lambda: _training(kubectl, ns, name), 600, f"{name} to train", interval=1)
    pods = [p["metadata"]["name"] for p in kubectl.pods(ns, name)]
    watches = [Termination(kubectl, ns, pod) for pod in pods]
    for w in watches:
        w.start()
    time.sleep(1)
    for w in watches:
        w.start_clock()
    t0 = time.monotonic()
    kubectl("delete", "trainingjob", name, "-n", ns, "--wait=false")
    for w in watches:
        w.join(130)
    lines = [f"{w.pod}: exit {w.terminated and w.terminated.get('exitCode')} "
             f"({w.terminated and w.terminated.get('reason')}), pod gone after {w.gone_after} s" for w in watches]
    print("\n" + "\n".join(lines), file=sys.stderr)
    record(f"TrainingJob deleted: all {len(pods)} pods gone", time.monotonic() - t0)
    for w in watches:
        assert w.gone_after is not None, f"{w.pod} still exists"
        # SIGTERM, not the SIGKILL after the grace period (137): each process stopped by itself.
        assert w.terminated is None or w.terminated.get("exitCode") != 137, lines


@pytest.mark.timeout(900)
def test_inside_the_pods_dns_probes_and_security(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    """While a job trains: the kubelet's gRPC probes pass, and inside a worker the PS's DNS name
    resolves to the PS pod, the process is uid 1000, / is read-only and /tmp is writable."""
    name = "mnist-inside"
    kubectl.apply(ns, mnist_job(name, big_data))
    wait_for(lambda: _training(kubectl, ns, name), 600, f"{name} to train", interval=1)
    # The kubelet runs the gRPC readiness probe: PS 0 turns Ready only once its health service answers.
    def ps_ready() -> bool:
        pod = kubectl.json("get", "pod", f"{name}-ps-0", "-n", ns)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))

    wait_for(ps_ready, 180, "PS 0 Ready (gRPC readiness probe run by the kubelet)", interval=1)
    ps_ip = kubectl.json("get", "pod", f"{name}-ps-0", "-n", ns)["status"]["podIP"]
    # Inside a worker, as its process sees it: the PS's DNS name (CoreDNS), the user, the read-only
    # root filesystem, the writable emptyDir at /tmp.
    probe = (
        "import os, socket\n"
        f"print('dns', socket.getaddrinfo('{name}-ps-0.{ns}.svc', 2222)[0][4][0])\n"
        "print('uid', os.getuid())\n"
        "try:\n    open('/home/elasticps/x', 'w')\n    print('rootfs writable')\n"
        "except OSError as e:\n    print('rootfs', e.errno, e.strerror)\n"
        "open('/tmp/x', 'w').write('ok'); print('tmp writable')\n"
    )
    seen = kubectl("exec", "-n", ns, f"{name}-worker-0", "-c", "elasticps", "--", "python3", "-c", probe, check=False)
    print(f"\nkubectl exec in worker-0:\n{seen.stdout}{seen.stderr}", file=sys.stderr)
    assert f"dns {ps_ip}" in seen.stdout, seen.stdout + seen.stderr
    assert "uid 1000" in seen.stdout
    assert "rootfs 30 Read-only file system" in seen.stdout
    assert "tmp writable" in seen.stdout

    def worker_ready() -> bool:
        pod = kubectl.json("get", "pod", f"{name}-worker-0", "-n", ns)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))

    wait_for(worker_ready, 120, "worker 0 Ready (its gRPC readiness probe, run by the kubelet)", interval=1)
    events = kubectl("get", "events", "-n", ns, "--field-selector", "reason=Unhealthy", "-o", "name", check=False).stdout
    print(f"probe failures reported by the kubelet: {events.split() or 'none'}", file=sys.stderr)
    kubectl("delete", "trainingjob", name, "-n", ns, "--wait=false")


@pytest.mark.timeout(900)
def test_kubectl_scale_adds_a_worker_to_a_training_job(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    """`kubectl scale` (the CRD's scale subresource) on a job that trains: a second worker pod starts
    on the node, joins, and the job still succeeds."""
    name = "mnist-scale"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, big_data, workers=1))
    wait_for(lambda: _training(kubectl, ns, name), 600, f"{name} to train with 1 worker", interval=1)
    kubectl("scale", f"trainingjob/{name}", "-n", ns, "--replicas=2")

    def second_worker_running() -> bool:
        pods = [p for p in kubectl.pods(ns, name) if p["metadata"]["labels"].get("elasticps.io/replica-type") == "worker"]
        return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

    wait_for(second_worker_running, 300, "a second worker pod Running after kubectl scale", interval=1)
    t_scaled = time.monotonic() - t0
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    print(f"\n{kubectl.show(ns)}\nstatus: {status}", file=sys.stderr)
    record(f"MNIST sync scaled 1 -> 2 workers while training: 2 workers Running after {t_scaled:.1f} s; apply -> {phase}",
           time.monotonic() - t0)
    assert phase == "Succeeded", status


def _host_pid(pod: str) -> int | None:
    """The host pid of pod ``pod``'s ``elasticps`` process (PID 1 of its container), found by the
    HOSTNAME the kubelet sets to the pod's name."""
    hostname = f"HOSTNAME={pod}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/elasticps") for a in argv[:2]) and hostname in environ:
            return int(proc.name)
    return None


@pytest.mark.timeout(1200)
def test_worker_killed_in_its_pod_is_replaced_and_counted(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    """kill -9 of a worker's process (from the host, as the OOM killer would): its pod fails with exit
    137, the operator replaces it per restartPolicy OnFailure and counts one restart; every record is
    still trained."""
    name = "mnist-worker-kill"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, big_data))
    wait_for(lambda: int(_status(kubectl, ns, name).get("modelVersion") or 0) >= 40, 600,
             f"{name} to train (modelVersion >= 40 of ~469)", interval=0.5)
    pid = wait_for(lambda: _host_pid(f"{name}-worker-0"), 30, "worker-0's process on the host")
    os.kill(pid, signal.SIGKILL)
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    record(f"MNIST sync, worker-0's process killed (-9) mid-training: apply -> {phase}", time.monotonic() - t0)
    report("worker-0's process killed with SIGKILL in its pod, replaced", kubectl.show(ns), status)
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status
    assert status.get("restarts") == 1, status


@pytest.mark.timeout(1200)
def test_ps_killed_in_its_pod_restores_and_is_counted(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    """kill -9 of PS 0's process, checkpoints on a hostPath: its pod fails with exit 137, the operator
    replaces it (restartPolicy Always) and counts one restart, the new PS restores the newest
    checkpoint, and every record is still trained."""
    name = "mnist-ps-kill"
    ckpt = CACHE / "node-checkpoints" / ns
    ckpt.mkdir(parents=True, exist_ok=True)
    ckpt.chmod(0o777)  # the PS runs as uid 1000
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(
        name, big_data,
        ps_volumes=[{"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}}],
        ps_mounts=[{"name": "ckpt", "mountPath": "/ckpt"}],
        training={"checkpointDir": "/ckpt", "checkpointSteps": 20},
    ))
    wait_for(lambda: int(_status(kubectl, ns, name).get("modelVersion") or 0) >= 60, 600,
             f"{name} past its first checkpoints (modelVersion >= 60 of ~469)", interval=0.5)
    before = int(_status(kubectl, ns, name).get("modelVersion") or 0)
    pid = wait_for(lambda: _host_pid(f"{name}-ps-0"), 30, "PS 0's process on the host")
    os.kill(pid, signal.SIGKILL)

    def resumed() -> str:
        logs = kubectl("logs", f"{name}-ps-0", "-n", ns, check=False).stdout
        return next((line for line in logs.splitlines() if "resumes at version" in line), "")

    line = wait_for(resumed, 300, "the new PS 0 to restore its checkpoint", interval=0.5)
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    record(f"MNIST sync, ps-0's process killed (-9) at version {before}: apply -> {phase}", time.monotonic() - t0)
    report(f"ps-0's process killed with SIGKILL at version {before} ({line.strip()})", kubectl.show(ns), status)
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status
    assert status.get("restarts") == 1, status


def _workers(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in kubectl.pods(ns, name) if p["metadata"]["labels"].get("elasticps.io/replica-type") == "worker"]


@pytest.mark.timeout(1200)
def test_kubectl_scale_sync_job_up_and_down(kubectl: Kubectl, ns: str, big_data: Path) -> None:
    """Sync training (gradsToWait 0: a round averages one gradient per live worker) scaled 2 -> 4 -> 1
    with `kubectl scale` while it trains, each step once the previous count runs and the model moved:
    the rounds follow the live workers, every record is trained, the shards agree, and the
    scaled-down pods are gone."""
    name = "mnist-sync-scale"
    t0 = time.monotonic()
    kubectl.apply(ns, mnist_job(name, big_data, workers=2, epochs=3, training={"gradsToWait": 0}))
    wait_for(lambda: _training(kubectl, ns, name), 600, f"{name} to train with 2 workers", interval=1)
    seen: set[str] = set()
    for count in (4, 1):
        before = int(_status(kubectl, ns, name).get("modelVersion") or 0)
        t_scale = time.monotonic()
        kubectl("scale", f"trainingjob/{name}", "-n", ns, f"--replicas={count}")

        def settled(count: int = count, before: int = before) -> bool:
            pods = [p for p in _workers(kubectl, ns, name) if not p["metadata"].get("deletionTimestamp")]
            seen.update(p["metadata"]["name"] for p in pods)
            status = _status(kubectl, ns, name)
            return (len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods)
                    and status.get("liveWorkers") == count and int(status.get("modelVersion") or 0) > before)

        wait_for(settled, 300, f"{count} workers Running, live and training after kubectl scale", interval=1)
        record(f"MNIST sync, kubectl scale --replicas={count}: that many workers Running, live and training after",
               time.monotonic() - t_scale)
    phase = wait_for(lambda: _finished(kubectl, ns, name), 900, f"{name} to finish", interval=3)
    status = _status(kubectl, ns, name)
    record(f"MNIST sync scaled 2 -> 4 -> 1 workers while training: apply -> {phase}", time.monotonic() - t0)
    report("sync job scaled 2 -> 4 -> 1 with kubectl scale", kubectl.show(ns), status)
    assert phase == "Succeeded", status
    assert status.get("progress") == "100%", status  # every record trained across the three worker counts
    versions = status.get("shardVersions") or []
    assert versions and len(set(versions)) == 1, status
    assert {f"{name}-worker-{i}" for i in range(4)} <= seen, seen
    wait_for(lambda: len(_workers(kubectl, ns, name)) == 1, 120, "the scaled-down worker pods to be gone")
