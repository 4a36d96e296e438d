"""Job identity on the real node (issue 35): a pod that is no member of a job, in the job's own
namespace, dials its PS and coordinator as a worker would (the PS Service's DNS name, gRPC and the
bulk port) while the job trains: every call is refused UNAUTHENTICATED, and the job goes on to
Succeeded. The job's pods read their tokens from the Secret the operator made for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_kit import IMAGE, NODE_LABEL, Kubectl, mnist_job, report, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.node]

# Runs in the stranger's pod (the project's image, no token): every method of the PS and coordinator
# services over gRPC, and each bulk method behind a hello without a token; prints the codes as JSON.
STRANGER = r"""
import json, socket, sys
import grpc
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import bulk
host = sys.argv[1]
codes = {}
channel = grpc.insecure_channel(f"{host}:2222")
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
for method, number in (("PullDense", bulk.PULL_DENSE), ("JoinRound", bulk.JOIN_ROUND)):
    body = pb.PullRequest(worker="worker-0").SerializeToString()
    with socket.create_connection((host, 2224), timeout=10) as sock:
        deadline = bulk.Deadline.within(10, 10, method)
        bulk.send(sock, [*bulk.hello(""), bulk.REQUEST.pack(bulk.MAGIC, number), bulk.LENGTH.pack(len(body)), body], deadline)
        codes[f"bulk.{method}"] = bulk.read_reply(sock, deadline)[0].name
print(json.dumps(codes))
"""


def stranger_pod(ns: str, host: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stranger", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [{"key": NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "stranger", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-c", STRANGER, host]}],
        },
    }


def test_a_pod_outside_the_job_is_refused_by_its_ps_and_the_job_succeeds(kubectl: Kubectl, ns: str, data: Path) -> None:
    name = "members"
    # Long enough that the job still runs while the stranger's pod starts and dials (with 2 epochs
    # the job once ended first, and the stranger found no PS to dial).
    kubectl.apply(ns, mnist_job(name, data, use_async=True, epochs=8))
    wait_for(lambda: int(kubectl.job(ns, name).get("status", {}).get("modelVersion") or 0) >= 20, 600,
             f"{name} to train 20 versions", interval=2)  # fmt: skip
    kubectl.apply(ns, stranger_pod(ns, f"{name}-ps-0.{ns}.svc"))
    phase = wait_for(lambda: (p := kubectl.json("get", "pod", "stranger", "-n", ns)["status"].get("phase"))
                     in ("Succeeded", "Failed") and p, 300, "the stranger's pod to end", interval=2)  # fmt: skip
    logs = kubectl("logs", "stranger", "-n", ns).stdout
    assert phase == "Succeeded", logs
    codes = json.loads(logs.strip().splitlines()[-1])
    print(f"\nthe stranger's {len(codes)} calls: {sorted(set(codes.values()))}")
    assert len(codes) == 8 + 5 + 2  # every PS and coordinator method, the 2 bulk calls
    assert {call: code for call, code in codes.items() if code != "UNAUTHENTICATED"} == {}
    status = wait_for(lambda: (s := kubectl.job(ns, name)["status"]).get("phase") in ("Succeeded", "Failed") and s,
                      900, f"{name} to finish", interval=3)  # fmt: skip
    report(f"a stranger's {len(codes)} calls to a running job's PS: all UNAUTHENTICATED", kubectl.show(ns), status)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0
