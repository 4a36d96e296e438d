"""Job identity on `elasticps run` (issue 35): while a sync job trains, a stranger on this machine
who knows every port of its PS processes is refused by every call (gRPC and the bulk channel) and
aborts no round; the job ends with every record trained once per epoch.

The run makes its key and hands each process its token (``local/fleet.py``); the test reads the PS
ports from the run's port files, the bulk ports with the run's observer token, and calls as a
stranger with no token, a forged one and a worker's name without its mac.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from local_jobs import elasticps, job_document, stop_run, wait_for, write_data, write_job
from bench import malformed
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.proto import elasticps_pb2 as pb
from elasticps.rpc import bulk
from elasticps.rpc.channels import create_channel

pytestmark = pytest.mark.slow

RECORDS = 6000
SHARDS = 2
STRANGERS = {"no token": "", "forged": "worker-0." + "0" * 64, "a name alone": "worker-0"}
SERVICES = {name: pb.DESCRIPTOR.services_by_name[name] for name in ("ParameterServer", "Coordinator")}
STREAMED = {"PushGradients", "PushModel"}
STREAMING_REPLIES = {"PullDense", "PullEmbeddings"}


def call(address: str, token: str, service: str, method: str) -> grpc.StatusCode:
    """``method`` with an empty request (a stream of one empty frame), as the caller ``token``."""
    channel = create_channel(address, token)
    path = f"/{SERVICES[service].full_name}/{method}"
    ident: Callable[[bytes], bytes] = lambda x: x  # noqa: E731
    try:
        if method in STREAMED:
            channel.stream_unary(path, ident, ident)(iter([b""]), timeout=10)
        elif method in STREAMING_REPLIES:
            list(channel.unary_stream(path, ident, ident)(b"", timeout=10))
        else:
            channel.unary_unary(path, ident, ident)(b"", timeout=10)
    except grpc.RpcError as err:
        assert isinstance(err, grpc.Call)
        return err.code()
    finally:
        channel.close()
    return grpc.StatusCode.OK


def bulk_call(port: int, token: str, method: str) -> grpc.StatusCode:
    """A bulk call behind a hello with ``token``: its status."""
    request: list[bytes] | bytes = pb.PullRequest(worker="worker-0").SerializeToString()
    if method == "PushGradients":
        request = malformed.stream(malformed.push_head(worker="worker-0"), [])
    elif method == "JoinRound":
        request = pb.JoinRequest(worker="worker-0").SerializeToString()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        parts: list[bytes | memoryview] = [*bulk.hello(token), bulk.REQUEST.pack(bulk.MAGIC, malformed.BULK_METHODS[method])]
        frames = [request] if isinstance(request, bytes) else [*request]
        for frame in frames:
            parts += [bulk.LENGTH.pack(len(frame)), frame]
        if not isinstance(request, bytes):
            parts.append(bulk.LENGTH.pack(0))
        deadline = bulk.Deadline.within(10, 10, method)
        try:
            bulk.send(sock, parts, deadline)
        except OSError:
            pass
        return bulk.read_reply(sock, deadline)[0]


def test_a_stranger_is_refused_by_every_process_of_a_run_and_aborts_no_round(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rounds_log = tmp_path / "rounds"
    monkeypatch.setenv("ELASTICPS_ROUND_LOG", str(rounds_log))
    train, validation = write_data(tmp_path, records=RECORDS)
    job = write_job(tmp_path / "job.yaml", job_document("strangers", train, validation, numEpochs=2))
    run_dir, result_file = tmp_path / "run", tmp_path / "result.json"
    process = elasticps("run", str(job), "--run_dir", str(run_dir), "--result_file", str(result_file), cwd=tmp_path)
    try:
        wait_for(lambda: all((run_dir / f"ps-{i}.port").exists() for i in range(SHARDS)), 120, "the PS to serve")
        addresses = [f"127.0.0.1:{int((run_dir / f'ps-{i}.port').read_text())}" for i in range(SHARDS)]
        observer = observer_token(run_dir)
        status = CoordinatorClient(addresses[0], worker="test", token=observer)
        wait_for(lambda: status.status().model_version >= 5, 180, "5 sync rounds")

        codes: dict[str, grpc.StatusCode] = {}
        for shard, address in enumerate(addresses):
            services = SERVICES if shard == 0 else {"ParameterServer": SERVICES["ParameterServer"]}
            for name, token in STRANGERS.items():
                for service, descriptor in services.items():
                    for method in descriptor.methods:
                        codes[f"ps-{shard} {service}.{method.name} ({name})"] = call(address, token, service, method.name)
            stub_channel = create_channel(address, observer)
            describe = stub_channel.unary_unary(f"/{SERVICES['ParameterServer'].full_name}/DescribeShard",
                                                pb.DescribeRequest.SerializeToString, pb.ShardState.FromString)
            bulk_port = describe(pb.DescribeRequest(), timeout=10).bulk_port
            stub_channel.close()
            assert bulk_port > 0
            for name, token in STRANGERS.items():
                for method in malformed.BULK_METHODS:
                    codes[f"ps-{shard} bulk {method} ({name})"] = bulk_call(bulk_port, token, method)
        assert len(codes) == len(STRANGERS) * (2 * 8 + 5 + 2 * 4)  # 8 PS methods, 5 coordinator, 4 bulk
        assert {name: code for name, code in codes.items() if code is not grpc.StatusCode.UNAUTHENTICATED} == {}
        _, stderr = process.communicate(timeout=300)
    finally:
        stop_run(process)
    assert process.returncode == 0, stderr
    result = json.loads(result_file.read_text())
    assert result["epoch_records"] == [RECORDS, RECORDS]
    logs = "".join((run_dir / f"strangers-ps-{i}.log").read_text() for i in range(SHARDS))
    assert "aborted" not in logs
