"""One run of one system of ``bench.peer``, as a child process of the benchmark, measured alike.

Both systems start as one command the benchmark waits for:

* the peer: ``python -m bench.peer_tf --job JOB --out FILE`` (its TensorFlow servers are its own
  children, killed and waited before it exits);
* elasticps: ``python -m elasticps run JOB --run_dir DIR --result_file FILE`` (the local runner
  waits for every PS and worker process it stops, ``elasticps.local.processes.stop_all``).

So ``getrusage(RUSAGE_CHILDREN)`` around the wait counts the CPU seconds of every process of the run
(a process's reaped children are added to its own when it is reaped), for both systems alike. Times
are from the moment the benchmark starts the command (``time.monotonic``, one clock for all
processes of the machine): the peer's own figures are shifted by the time its interpreter took to
start, elasticps's come from PS 0's coordinator polled every ``POLL_S`` (``bench.peer_timeline``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench.cpu_caps import CpuCaps
from bench.peer_jobs import WORKER_REPLICAS
from bench.peer_tf import cpu_seconds
from bench.peer_timeline import Sample, figures
from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token, worker_threads
from elasticps.proto import elasticps_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.05
RUN_TIMEOUT_S = 1800.0


class RunFailed(RuntimeError):
    """The command exited with an error or gave no result; the message has its log's tail."""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _live_cpu_s(runner: int, run_dir: Path) -> float | None:
    """CPU seconds so far of the runner and of the replicas it started (their pid files): an epoch's
    CPU is the difference at its two ends. None when one could not be read (a process just exited)."""
    try:
        pids = [runner, *(int(p.read_text()) for p in run_dir.glob("*.pid"))]
        return sum(cpu_seconds(pid) for pid in pids)
    except (OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return ""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


def peer_threads() -> int:
    """The intra-op threads of the peer's processes: what `elasticps run` gives each of its workers
    (``local.fleet.worker_threads``: the machine's CPUs over the workers), so both systems run
    their gradient computations with pools of one size. The inter-op pools keep TensorFlow's
    default: the peer's servers run remote ops through them, and with 1 thread they deadlocked."""
    return worker_threads(len(os.sched_getaffinity(0)), WORKER_REPLICAS)


def _tensor_bytes(status: pb.JobStatus) -> int | None:
    """Every shard's tensor bytes received and sent so far (None: a shard did not answer)."""
    counts = [*status.shard_bytes_received, *status.shard_bytes_sent]
    return None if not counts or min(counts) < 0 else sum(counts)


def _per_1000(cpu_s: float, examples: int) -> float:
    return cpu_s / (examples / 1000) if examples else float("nan")


def run_peer(job: Path, work: Path) -> dict[str, Any]:
    out, log = work / "peer.json", work / "peer.log"
    cpu_before = _children_cpu_s()
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.peer_tf", "--job", str(job), "--out", str(out)],
            cwd=REPO, env={**_env(), "TF_NUM_INTRAOP_THREADS": str(peer_threads())},
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )
        code = process.wait(timeout=RUN_TIMEOUT_S)
    exited_s = time.monotonic() - started
    cpu_s = _children_cpu_s() - cpu_before
    if code != 0 or not out.exists():
        raise RunFailed(f"bench.peer_tf exited with {code}:\n{_tail(log)}")
    peer = json.loads(out.read_text())
    shift = float(peer["started_monotonic"]) - started  # the interpreter's start, before the peer's clock
    examples = int(peer["examples"])
    return {
        "wall_s": peer["wall_s"] + shift,
        "first_step_s": peer["first_step_s"] + shift,
        "examples_per_s_epoch2": peer["examples_per_s_epoch2"],
        "test_accuracy": peer["test_accuracy"],
        "cpu_s": cpu_s,
        "cpu_s_per_1000_examples": _per_1000(cpu_s, examples),
        "cpu_s_per_1000_examples_epoch2": peer["epochs"][1].get("cpu_s_per_1000_examples") if len(peer["epochs"]) > 1 else None,
        "examples": examples,
        "exited_s": exited_s,
        "evaluation_s": peer["evaluation_s"],
        "epochs": peer["epochs"],
        "interpreter_start_s": shift,
        "steps_per_execution": peer["steps_per_execution"],
        "tensorflow": peer["tensorflow"],
        "intra_op_threads": peer_threads(),
    }


def run_elasticps(
    job: Path, work: Path, num_epochs: int, keep_samples: bool = False, worker_cpus: float | None = None
) -> dict[str, Any]:
    """One ``elasticps run`` of ``job``, measured; with ``keep_samples``, every answer of the
    coordinator polled (``samples``: the timeline of accuracy, versions, bytes and LocalSGD's K);
    with ``worker_cpus``, each worker held to that many CPUs (``bench.cpu_caps``)."""
    run_dir, result_file, log = work / "run", work / "result.json", work / "elasticps.log"
    # Where the coordinator's port appears: PS 0's under the PS strategy, the coordinator's otherwise.
    port_files = (run_dir / "ps-0.port", run_dir / "coordinator.port")
    samples: list[Sample] = []
    client: CoordinatorClient | None = None
    caps = CpuCaps(worker_cpus, f"elasticps-bench-{os.getpid()}-{work.name}") if worker_cpus else None
    cpu_before = _children_cpu_s()
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "elasticps", "run", str(job), "--run_dir", str(run_dir),
             "--result_file", str(result_file)],
            cwd=REPO, env=_env(), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
        )
        try:
            while process.poll() is None:
                if time.monotonic() - started > RUN_TIMEOUT_S:
                    process.terminate()
                    break
                if caps is not None:
                    caps.hold(run_dir)
                port_file = next((p for p in port_files if p.exists()), None)
                if client is None and port_file is not None:
                    text = port_file.read_text().strip()
                    if text:
                        client = CoordinatorClient(f"127.0.0.1:{int(text)}", worker="bench", token=observer_token(run_dir))
                if client is not None:
                    try:
                        reply = client.status(timeout_s=1.0)
                    except grpc.RpcError:
                        pass  # PS 0 starting, or stopped with the job
                    else:
                        samples.append(
                            Sample(
                                t=time.monotonic() - started,
                                records_done=reply.records_done,
                                records_total=reply.records_total,
                                model_version=reply.model_version,
                                finished=reply.finished,
                                cpu_s=_live_cpu_s(process.pid, run_dir),
                                tensor_bytes=_tensor_bytes(reply),
                                accuracy=reply.metrics["accuracy"] if "accuracy" in reply.metrics else None,
                                local_steps=reply.local_steps,
                                min_iteration=reply.min_iteration,
                            )
                        )
                time.sleep(POLL_S)
        finally:
            if client is not None:
                client.close()
            code = process.wait()
            if caps is not None:
                caps.close()
    exited_s = time.monotonic() - started
    cpu_s = _children_cpu_s() - cpu_before
    if code != 0 or not result_file.exists():
        raise RunFailed(f"elasticps run exited with {code}:\n{_tail(log)}")
    result = json.loads(result_file.read_text())
    if not result.get("succeeded"):
        raise RunFailed(f"elasticps run: {result.get('reason')}")
    timed = figures(samples, num_epochs)
    examples = int(result["records_done"])
    return {
        "wall_s": timed["wall_s"],
        "first_step_s": timed["first_step_s"],
        "examples_per_s_epoch2": timed["examples_per_s_epoch2"],
        "test_accuracy": result["metrics"].get("accuracy"),
        "cpu_s": cpu_s,
        "cpu_s_per_1000_examples": _per_1000(cpu_s, examples),
        "cpu_s_per_1000_examples_epoch2": timed["cpu_s_per_1000_examples_epoch2"],
        "tensor_bytes_epoch2": timed["tensor_bytes_epoch2"],
        "examples": examples,
        "exited_s": exited_s,
        "evaluation_s": timed["evaluation_s"],
        "epochs": timed["epochs"],
        "polls": timed["samples"],
        "model_version": result["model_version"],
        "gradients_rejected": result["gradients_rejected"],
        "staleness": result["staleness"],
        "tasks_requeued": result["tasks_requeued"],
        "restarts": result["restarts"],
        **({"samples": [dataclasses.asdict(s) for s in samples]} if keep_samples else {}),
    }
