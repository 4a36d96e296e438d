"""Job identity on the real node (issue 35): a pod that is no member of a job, in the job's own
namespace, dials its PS and coordinator as a worker would (the PS Service's DNS name, gRPC and the
bulk port) while the job trains: every call is refused UNAUTHENTICATED, and the job goes on to
Succeeded. The job's pods read their tokens from the Secret the operator made for it, mounted; the
operator rotates the job's key while it trains, the kubelet rewrites the mounted files, and the
job's processes follow without one refused call; a token of the old key is refused after.

The jobs here have more epochs than the tests wait for: how fast a job trains varies too much on
these machines for any count to outlast the test and still end soon after it (8 epochs once ended in
15 s, before the stranger dialed; 150 once ended before the rotation's last step). Each test shows
the job trains on after the strangers' calls, without a restart, and then deletes it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elasticps import identity
from node_kit import IMAGE, NODE_LABEL, OPERATOR_NS, RELEASE, ROOT, Kubectl, mnist_job, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]

# Runs in the stranger's pod (the project's image): every method of the PS and coordinator services
# over gRPC, and each bulk method behind a hello, with the token it is given (none by default);
# prints the codes as JSON.
STRANGER = r"""
import json, socket, sys
import grpc
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import bulk
from elasticps.rpc.channels import create_channel
host = sys.argv[1]
token = sys.argv[2] if len(sys.argv) > 2 else ""
codes = {}
channel = create_channel(f"{host}:2222", token)
for service in ("ParameterServer", "Coordinator"):
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    for method in descriptor.methods:
        path = f"/{descriptor.full_name}/{method.name}"
        try:
            if method.client_streaming:
                channel.stream_unary(path)(iter([b""]), timeout=10)
            elif method.server_streaming:
                list(channel.unary_stream(path)(b"", timeout=10))
            else:
                channel.unary_unary(path)(b"", timeout=10)
            codes[f"{service}.{method.name}"] = "OK"
        except grpc.RpcError as err:
            codes[f"{service}.{method.name}"] = err.code().name
for method, number, body in (("PullDense", bulk.PULL_DENSE, pb.PullRequest(worker="worker-0").SerializeToString()),
                             ("JoinRound", bulk.JOIN_ROUND, pb.JoinRequest(worker="worker-0").SerializeToString()),
                             ("PullEmbeddings", bulk.PULL_ROWS, pb.EmbeddingRequest(worker="worker-0").SerializeToString())):
    with socket.create_connection((host, 2224), timeout=10) as sock:
        deadline = bulk.Deadline.within(10, 10, method)
        bulk.send(sock, [*bulk.hello(token), bulk.REQUEST.pack(bulk.MAGIC, number), bulk.LENGTH.pack(len(body)), body], deadline)
        codes[f"bulk.{method}"] = bulk.read_reply(sock, deadline)[0].name
print(json.dumps(codes))
"""


def stranger_pod(ns: str, host: str, token: str = "", name: str = "stranger") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "stranger", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-c", STRANGER, host, token]}],
        },
    }


def stranger_calls(kubectl: Kubectl, ns: str, host: str, token: str = "", name: str = "stranger") -> dict[str, str]:
    """The codes of the stranger's calls, run in a pod of its own."""
    kubectl.apply(ns, stranger_pod(ns, host, token, name))
    phase = wait_for(lambda: (p := kubectl.json("get", "pod", name, "-n", ns)["status"].get("phase"))
                     in ("Succeeded", "Failed") and p, 300, f"the {name} pod to end", interval=2)  # fmt: skip
    logs = kubectl("logs", name, "-n", ns).stdout
    assert phase == "Succeeded", logs
    codes: dict[str, str] = json.loads(logs.strip().splitlines()[-1])
    return codes


EPOCHS = 100_000  # more than any test waits for (tasks are made an epoch at a time)


def version(kubectl: Kubectl, ns: str, name: str) -> int:
    return int(kubectl.job(ns, name).get("status", {}).get("modelVersion") or 0)


def trains_on(kubectl: Kubectl, ns: str, name: str, past: int) -> dict[str, Any]:
    """The job's status once it has trained 20 versions past ``past``, still running without a
    restart; the job is then deleted, its pods with it."""
    wait_for(lambda: version(kubectl, ns, name) >= past + 20, 600, f"{name} to train 20 versions past {past}",
             interval=2)  # fmt: skip
    status: dict[str, Any] = kubectl.job(ns, name)["status"]
    kubectl("delete", "trainingjob", name, "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: not kubectl.pods(ns, name), 120, f"{name}'s pods to go", interval=2)
    return status


@pytest.mark.timeout(1200)
def test_a_pod_outside_the_job_is_refused_by_its_ps_and_the_job_trains_on(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "members"
    kubectl.apply(ns, mnist_job(name, data, use_async=True, epochs=EPOCHS))
    wait_for(lambda: version(kubectl, ns, name) >= 20, 600, f"{name} to train 20 versions", interval=2)
    codes = stranger_calls(kubectl, ns, f"{name}-ps-0.{ns}.svc")
    after = version(kubectl, ns, name)
    print(f"\nthe stranger's {len(codes)} calls: {sorted(set(codes.values()))}")
    assert len(codes) == 8 + 5 + 3  # every PS and coordinator method, the 3 bulk calls
    assert {call: code for call, code in codes.items() if code != "UNAUTHENTICATED"} == {}
    shown = kubectl.show(ns)
    status = trains_on(kubectl, ns, name, after)
    report(f"a stranger's {len(codes)} calls to a running job's PS: all UNAUTHENTICATED", shown, status)
    assert status["phase"] == "Running", status
    assert status["restarts"] == 0


GRACE_S = 30  # the kubelet here syncs pods every 10 s (hack/cluster/realnode.py)


@pytest.fixture
def quick_rotation(kubectl: Kubectl, operator: str) -> Iterator[None]:
    """The operator with rotation steps GRACE_S apart (120 s by default), restored after."""

    def upgrade(*flags: str) -> None:
        done = subprocess.run(["helm", "upgrade", RELEASE, str(ROOT / "helm" / "elasticps"), "-n", OPERATOR_NS,
                               "--reuse-values", "--set-json", f"extraArgs={json.dumps(list(flags))}", "--wait",
                               "--timeout", "3m"], env=kubectl.env, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr

    upgrade(f"--identity_grace_seconds={GRACE_S}")
    yield
    upgrade()


def secret_state(kubectl: Kubectl, ns: str, job: str) -> tuple[str, bytes]:
    found = kubectl.json("get", "secret", f"{job}-identity", "-n", ns)
    key = identity.parse_key(base64.b64decode(found["data"]["key"]).decode())
    return found["metadata"]["annotations"]["elasticps.io/identity-phase"], key


@pytest.mark.timeout(1200)
def test_the_key_rotates_under_a_training_job_and_the_old_key_is_refused_after(
    kubectl: Kubectl, ns: str, data: Path, quick_rotation: None
) -> None:
    name = "rotating"
    kubectl.apply(ns, mnist_job(name, data, use_async=True, epochs=EPOCHS))
    wait_for(lambda: version(kubectl, ns, name) >= 20, 600, f"{name} to train 20 versions", interval=2)
    phase, old = secret_state(kubectl, ns, name)
    assert phase == "stable"
    stale = identity.token_for(old, "worker-0")  # a member's token of the old key
    kubectl("annotate", "trainingjob", name, "-n", ns, "elasticps.io/rotate-identity=node-test")
    phases = [phase]

    def settled() -> bool:
        phase = secret_state(kubectl, ns, name)[0]
        if phase != phases[-1]:
            phases.append(phase)
        return phases[-1] == "stable" and len(phases) > 1

    wait_for(settled, 6 * GRACE_S + 60, "the rotation's three steps", interval=1)
    assert phases == ["stable", "adding", "switched", "stable"], phases
    new = secret_state(kubectl, ns, name)[1]
    assert new != old
    versions_at_rotation = version(kubectl, ns, name)
    # The last step is in the Secret; the kubelet puts it in the pods within its sync period (10 s),
    # inside the grace the steps keep apart.
    time.sleep(GRACE_S)
    # Each process read its new files: the workers' tokens, the PS's keys.
    for pod in (f"{name}-ps-0", f"{name}-worker-0", f"{name}-worker-1"):
        log = kubectl("logs", pod, "-n", ns).stdout + kubectl("logs", pod, "-n", ns).stderr
        assert "/var/run/elasticps/identity/" in log and "changed: read again" in log, (pod, log[-2000:])
    codes = stranger_calls(kubectl, ns, f"{name}-ps-0.{ns}.svc", stale, name="stale-member")
    assert {call: code for call, code in codes.items() if code != "UNAUTHENTICATED"} == {}
    shown = kubectl.show(ns)
    status = trains_on(kubectl, ns, name, version(kubectl, ns, name))
    events = [e["message"] for e in kubectl.json("get", "events", "-n", ns)["items"] if e["reason"] == "IdentityRotated"]
    report(f"the key rotated while {name} trained (steps {GRACE_S} s apart); the old key's worker-0 token: "
           f"{len(codes)} calls UNAUTHENTICATED; {len(events)} IdentityRotated events", shown, status)  # fmt: skip
    assert status["phase"] == "Running", status
    assert status["restarts"] == 0  # no member was ever refused
    assert int(status["modelVersion"]) > versions_at_rotation
    assert len(events) == 3
