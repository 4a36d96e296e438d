"""Helpers of the cluster tests: real kubectl, polling waits, the operator as a real process, and a
stand-in for PS 0's coordinator (kwok pods run nothing, so the test answers ``GetJobStatus``).

Imported by ``conftest.py`` and the tests (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import urllib3
import yaml

from elasticps.proto import elasticps_pb2 as pb
from elasticps.proto import elasticps_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Polls ``check`` until it returns something truthy; fails with ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Kubectl:
    env: dict[str, str]

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["kubectl", *args], env=self.env, input=input, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def apply(self, namespace: str, manifest: str | dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self("apply", "-n", namespace, "-f", "-", input=text, check=check)

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.json("get", "trainingjob", name, "-n", namespace)
        return found

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("get", "pods", "-n", namespace, "-l", f"elasticps.io/job-name={job}")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def events(self, namespace: str, job: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.kind=TrainingJob,involvedObject.name={job}"
        items: list[dict[str, Any]] = self.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
        return items

    def set_pod_exit(self, namespace: str, pod: str, exit_code: int, message: str = "") -> None:
        """Plays the kubelet: the pod's container terminated with ``exit_code`` (kwok runs nothing),
        ``message`` as its termination message."""
        phase = "Succeeded" if exit_code == 0 else "Failed"
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                      **({"message": message} if message else {})}
        patch = {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {"name": "elasticps", "ready": False, "state": {"running": None, "terminated": terminated}}
                ],
            }
        }
        self("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def phases(pods: list[dict[str, Any]]) -> dict[str, str]:
    return {p["metadata"]["name"]: p.get("status", {}).get("phase", "") for p in pods}


def training_job(name: str, workers: int = 2, n_ps: int = 1, **spec: Any) -> dict[str, Any]:
    """A small valid TrainingJob; ``spec`` entries are merged over the defaults one level deep."""
    body: dict[str, Any] = {
        "model": {"modelDef": "elasticps.backends.keras.zoo.mlp"},
        "data": {"training": "/data/train"},
        "ps": {"replicas": n_ps},
        "worker": {"replicas": workers},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return {"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": body}


# ---- watches ------------------------------------------------------------------------------------------
@dataclass
class Watch:
    """Every event of one watch (``path``: a collection of the API), in the API server's order, with the
    object's resourceVersion: ``events`` holds ``(type, name, resourceVersion, object)``. Events of two
    watches are ordered by resourceVersion (one etcd here: its revisions only grow)."""

    env: dict[str, str]
    path: str
    events: list[tuple[str, str, int, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # the stream closed (the server may close a slow watcher's)

    def start(self) -> Watch:
        import kubernetes.client
        import kubernetes.config

        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=self.env["KUBECONFIG"], client_configuration=configuration)
        client = kubernetes.client.ApiClient(configuration)
        request = client.param_serialize(
            "GET", self.path, query_params=[("watch", "true"), ("timeoutSeconds", "600")],
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = client.call_api(*request, _request_timeout=(10, 700))  # the body is left unread
        raw = response.response

        def run() -> None:
            assert client is not None  # held: a collected ApiClient closes its connections
            buffer = b""
            try:
                for chunk in raw.read_chunked(None, decode_content=True):
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            event = json.loads(line)
                            meta = event["object"]["metadata"]
                            self.events.append((event["type"], meta["name"], int(meta["resourceVersion"]), event["object"]))
                    if self._stop.is_set():
                        break
            except urllib3.exceptions.HTTPError:
                pass  # the connection went (the cluster stopped, or the test ended): so does the watch
            finally:
                self.ended.set()
            raw.release_conn()

        threading.Thread(target=run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


# ---- the operator, a real process ---------------------------------------------------------------------
IDENTITY_GRACE_S = 3.0  # between the steps of a key rotation: kwok's pods read no files


@dataclass
class Operator:
    env: dict[str, str]
    workdir: Path
    liveness_port: int
    coordinator_dir: Path
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    extra_args: tuple[str, ...] = ()  # more flags of `elasticps operator` (e.g. --kueue)

    @property
    def log_path(self) -> Path:
        return self.workdir / "operator.log"

    @property
    def stats_path(self) -> Path:
        return self.workdir / "api-requests.json"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "operator already running"
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"==== operator start #{self.starts} ====\n".encode())
        log.flush()
        command = [
            sys.executable, "-m", "elasticps", "--log_level", "INFO", "operator",
            "--stats_file", str(self.stats_path),
            "--coordinator_address", f"unix://{self.coordinator_dir}/{{namespace}}.{{job}}.sock",
            "--coordinator_timeout", "0.5",
            "--identity_grace_seconds", str(IDENTITY_GRACE_S),
            "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
            "--metrics_port", str(self.metrics_port),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for(self._ready, 60, "the operator's liveness endpoint")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"operator exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stats(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(self.stats_path.read_text())
            return found
        except (OSError, ValueError):
            return {}

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no operator log)"
        return "\n".join(text.splitlines()[-lines:])


# ---- PS 0's coordinator, played by the test -----------------------------------------------------------
@dataclass
class FakeCoordinator:
    """Answers ``GetJobStatus`` on the socket the operator dials for one job; other calls: UNIMPLEMENTED."""

    socket: Path
    reply: pb.JobStatus = field(default_factory=pb.JobStatus)
    server: grpc.Server | None = None
    tokens: list[str] = field(default_factory=list)  # the caller's token of each call (identity.METADATA_KEY)

    def start(self) -> FakeCoordinator:
        outer = self

        class Servicer(pb_grpc.CoordinatorServicer):  # type: ignore[misc]
            def GetJobStatus(self, request: pb.JobStatusRequest, context: grpc.ServicerContext) -> pb.JobStatus:
                metadata = dict(context.invocation_metadata())
                outer.tokens.append(str(metadata.get("elasticps-token", "")))
                return outer.reply

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_CoordinatorServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        return self

    def set(self, **fields: Any) -> None:
        self.reply = pb.JobStatus(**fields)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
        return text
