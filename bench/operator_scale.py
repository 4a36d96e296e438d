"""``make scale``: the operator at 2 PS + N workers on a tuned kwok cluster, at a given QPS and at its default.

The cluster (``hack/cluster/cluster.py up`` in a state dir of its own, ``down`` at the end) has enough
fake nodes for the largest job (``--nodes`` x ``--pods_per_node``) and its kube-scheduler and
kube-controller-manager run with a raised client rate (``--component_qps``/``--component_burst``):
their defaults (50 and 20 requests/s) would measure them, not the operator. kwok's own client has no
limit. The operator runs as a real process (``python -m elasticps operator``), once per QPS setting:
``--qps``/``--burst`` (what it is given here), then its defaults (``throttling.DEFAULT_QPS``/``_BURST``).

For each N in ``--workers``, in a fresh namespace, with watches on the job and its pods opened before:

* ``status_s``: ``kubectl apply`` -> the job's first ``.status`` seen (the Created status);
* ``last_create_s``: apply -> the operator's last pod create (its ``--stats_file``: the time it sent
  it), the operator's own share; ``last_bound_s``: apply -> the last pod bound to a node (the
  scheduler's); ``running_s``: apply -> every pod Running (kwok's, the last);
* ``requests``: the operator's requests for the job until then (kopf's included), per pod, by kind;
  ``peak_qps``: its busiest wall-clock second in that window;
* ``delete_s``: ``kubectl delete trainingjob`` -> every pod gone, and the requests that took.

The floor, in the same sitting and interleaved with those runs: the pods the operator made for its first
job of each size, created again by ``kubectl create`` alone (``--floor_processes`` kubectl processes
together, each a share) in a fresh namespace, so the API server, etcd, the scheduler and kwok do the
same work without the operator. Through Kueue (on unless ``--no_kueue``; the cluster comes up with it,
the operator runs with ``--kueue``): the same job labelled for a LocalQueue whose ClusterQueue has quota
for it, so its Workload is admitted before any pod is made. Each mode's time to its last pod created
and to every pod Running is reported over the floor's (median over median; the goal at most 1.2x).

t0 is taken just before ``kubectl apply`` (or the floor's first ``kubectl create``) starts, as a user
would time it. Writes
``bench/results/operator_scale.json`` (after every run), ``docs/operator-scale.md`` and
``docs/img/operator-scale.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from bench.doc_regions import write_region
from elasticps.operator.executing import DEFAULT_CONCURRENCY
from elasticps.operator.throttling import DEFAULT_BURST, DEFAULT_QPS

REPO = Path(__file__).resolve().parents[1]
CLUSTER_PY = REPO / "hack" / "cluster" / "cluster.py"
RESULTS = REPO / "bench" / "results" / "operator_scale.json"
DOC = REPO / "docs" / "operator-scale.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"  # its region operator-scale: the ratios
IMAGE = REPO / "docs" / "img" / "operator-scale.png"
JOB = "scale"
LABEL_JOB = "elasticps.io/job-name"


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the cluster and kubectl --------------------------------------------------------------------------
def cluster_up(state_dir: Path, args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "ELASTICPS_CLUSTER_DIR": str(state_dir), "GPU_NODES": "0"}
    build = subprocess.run(["bash", str(REPO / "hack" / "cluster" / "build.sh")], capture_output=True, text=True)
    if build.returncode != 0:
        sys.exit(f"hack/cluster/build.sh failed (no Go and no cached binaries?):\n{build.stderr[-2000:]}")
    command = [
        sys.executable, str(CLUSTER_PY), "up", "--cpu-nodes", str(args.nodes), "--pods-per-node", str(args.pods_per_node),
        "--kube-api-qps", str(args.component_qps), "--kube-api-burst", str(args.component_burst),
        "--kwok-parallelism", str(args.kwok_parallelism), *(["--kueue"] if args.kueue else []),
    ]  # fmt: skip
    up = subprocess.run(command, env=env, capture_output=True, text=True)
    if up.returncode != 0:
        sys.exit(f"cluster.py up failed:\n{up.stderr[-3000:]}")
    for line in up.stdout.splitlines():  # export KUBECONFIG=...; export PATH=BIN:$PATH
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def wait(check: Any, timeout: float, what: str | Callable[[], str], interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


# ---- watches ------------------------------------------------------------------------------------------
@dataclass
class Seen:
    """What the watches saw, with the wall-clock time each thing was first seen."""

    status_at: float | None = None
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    exist: set[str] = field(default_factory=set)
    gone_at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def api_client(env: dict[str, str], connections: int = 4) -> Any:
    import kubernetes.client
    import kubernetes.config

    configuration = kubernetes.client.Configuration()
    config: Any = kubernetes.config  # partly typed
    config.load_kube_config(config_file=env["KUBECONFIG"], client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return kubernetes.client.ApiClient(configuration)


def watch(env: dict[str, str], path: str, on_event: Any, stop: threading.Event) -> threading.Thread:
    """Streams ``path``'s watch events (JSON lines, read straight off the socket) to ``on_event``; a
    stream the server ends is resumed from the last resourceVersion seen."""
    client = api_client(env)

    def open_stream(version: str) -> Any:
        query = [("watch", "true"), ("timeoutSeconds", "900"), ("allowWatchBookmarks", "true")]
        if version:
            query.append(("resourceVersion", version))
        request = client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        response = client.call_api(*request, _request_timeout=(10, 1000))  # the body is left unread
        return response.response if hasattr(response, "response") else response

    first = open_stream("")

    def run() -> None:
        try:
            follow()
        except (OSError, urllib3.exceptions.HTTPError):
            pass  # the cluster went down at the end of the run

    def follow() -> None:
        raw, version = first, ""
        while not stop.is_set():
            buffer = b""
            for chunk in raw.read_chunked(None, decode_content=True):  # each chunk as it comes
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                now = time.time()
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        obj = event["object"]
                        version = obj.get("metadata", {}).get("resourceVersion", version)
                        if event["type"] != "BOOKMARK":
                            on_event(event["type"], obj, now)
                if stop.is_set():
                    break
            raw.release_conn()
            if not stop.is_set():
                log(f"watch {path} ended by the server: resumed from {version}")
                raw = open_stream(version)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def watch_job(env: dict[str, str], ns: str, seen: Seen, stop: threading.Event) -> None:
    def on_event(kind: str, obj: dict[str, Any], now: float) -> None:
        if obj.get("metadata", {}).get("name") == JOB and obj.get("status", {}).get("phase") and seen.status_at is None:
            seen.status_at = now

    watch(env, f"/apis/elasticps.io/v1alpha1/namespaces/{ns}/trainingjobs", on_event, stop)


def watch_pods(env: dict[str, str], ns: str, seen: Seen, stop: threading.Event) -> None:
    def on_event(kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata", {})
        if meta.get("labels", {}).get(LABEL_JOB) != JOB:
            return
        name = meta["name"]
        with seen.lock:
            if kind == "DELETED":
                seen.exist.discard(name)
                seen.gone_at[name] = now
                return
            seen.exist.add(name)
            seen.created.setdefault(name, now)
            if obj.get("spec", {}).get("nodeName"):
                seen.bound.setdefault(name, now)
            if obj.get("status", {}).get("phase") == "Running":
                seen.running.setdefault(name, now)

    watch(env, f"/api/v1/namespaces/{ns}/pods", on_event, stop)


# ---- the operator -------------------------------------------------------------------------------------
class Operator:
    def __init__(self, env: dict[str, str], workdir: Path, qps: float, burst: int, concurrency: int, kueue: bool) -> None:
        self.stats_path = workdir / f"requests-{qps:g}.json"
        self.log_path = workdir / f"operator-{qps:g}.log"
        command = [
            sys.executable, "-m", "elasticps", "--log_level", "INFO", "operator", "--stats_file", str(self.stats_path),
            "--kube_api_qps", str(qps), "--kube_api_burst", str(burst), "--kube_api_concurrency", str(concurrency),
            "--coordinator_timeout", "0.2", *(["--kueue"] if kueue else []),
        ]  # fmt: skip
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stats(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(self.stats_path.read_text())
            return found
        except (OSError, ValueError):
            return {}

    def settled(self, key: str, quiet_s: float = 2.5) -> dict[str, Any]:
        """The stats once the job's count has not moved for ``quiet_s`` (the file is rewritten each second)."""
        last, since = None, time.monotonic()
        while True:
            job = self.stats().get("jobs", {}).get(key)
            if job != last:
                last, since = job, time.monotonic()
            elif job and time.monotonic() - since >= quiet_s:
                return self.stats()
            time.sleep(0.25)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---- one run ------------------------------------------------------------------------------------------
REQUESTS = {"cpu": "10m", "memory": "16Mi"}  # every pod: what Kueue's quota counts (the same in every mode)
QUEUE = "scale"  # the LocalQueue a queued run's job names (kueue.x-k8s.io/queue-name)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def job_manifest(workers: int, queued: bool = False) -> str:
    role = {"resources": {"requests": REQUESTS}}
    metadata: dict[str, Any] = {"name": JOB}
    if queued:
        metadata["labels"] = {QUEUE_LABEL: QUEUE}
    return yaml.safe_dump({
        "apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "metadata": metadata,
        "spec": {"model": {"modelDef": "elasticps.backends.keras.zoo.mlp"}, "data": {"training": "/data/train"},
                 "ps": {"replicas": 2, **role}, "worker": {"replicas": workers, **role}},
    })  # fmt: skip


def queue_objects() -> list[dict[str, Any]]:
    """One ResourceFlavor and one ClusterQueue with quota for every job of the run (they run one at a time)."""
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": QUEUE}, "spec": {}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": QUEUE},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory"],
             "flavors": [{"name": QUEUE, "resources": [
                 {"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "10000Gi"}]}],
         }]}},
    ]  # fmt: skip


def local_queue(ns: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": ns},
            "spec": {"clusterQueue": QUEUE}}  # fmt: skip


def peak(per_second: dict[str, int], start: float, end: float) -> int:
    return max((n for s, n in per_second.items() if start - 1 < int(s) <= end), default=0)


def namespace(env: dict[str, str], prefix: str, workers: int) -> str:
    ns = f"{prefix}-{workers}-{uuid.uuid4().hex[:4]}"
    kubectl(env, "create", "namespace", ns)
    wait(lambda: subprocess.run(["kubectl", "get", "sa", "default", "-n", ns], env=env, capture_output=True).returncode == 0,
         30, "the default ServiceAccount")  # fmt: skip
    return ns


def observe(env: dict[str, str], ns: str) -> tuple[Seen, threading.Event]:
    seen, stop = Seen(), threading.Event()
    watch_job(env, ns, seen, stop)
    watch_pods(env, ns, seen, stop)
    time.sleep(0.5)  # the watches are open
    return seen, stop


def until_running(seen: Seen, pods: int, timeout: float) -> None:
    wait(lambda: len(seen.running) >= pods, timeout,
         lambda: f"{pods} pods Running (seen: {len(seen.exist)}, {len(seen.bound)} bound, {len(seen.running)} Running)")


def timings(seen: Seen, t0: float) -> dict[str, float]:
    """What every mode is measured by, from the same watch: the last pod to exist (its ADDED event),
    the last bound, the last Running."""
    return {
        "created_s": round(max(seen.created.values()) - t0, 3),
        "last_bound_s": round(max(seen.bound.values()) - t0, 3),
        "running_s": round(max(seen.running.values()) - t0, 3),
    }


ADMITTED_BY = ("kube-api-access-",)  # volumes the ServiceAccount admission adds to every pod


def bare(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod the operator created as a user would write it: no owner, status, node or server fields,
    and no service-account token volume (admission adds it again, as it did for the operator's)."""
    meta = pod["metadata"]
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    spec["volumes"] = [v for v in spec.get("volumes", []) if not v["name"].startswith(ADMITTED_BY)]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if not m["name"].startswith(ADMITTED_BY)]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}}  # fmt: skip


def run_one(env: dict[str, str], operator: Operator, workers: int, timeout: float,
            queued: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One job through the operator (and through Kueue first, ``queued``): the figures, and its pods
    as bare manifests (the floor's pods)."""
    ns = namespace(env, "kueue" if queued else "scale", workers)
    if queued:
        kubectl(env, "apply", "-f", "-", stdin=json.dumps(local_queue(ns)))
    pods = workers + 2
    seen, stop = observe(env, ns)
    try:
        key = f"{ns}/{JOB}"
        load = os.getloadavg()[0]  # the machine is shared: how busy it was, beside the figures
        t0 = time.time()
        kubectl(env, "apply", "-n", ns, "-f", "-", stdin=job_manifest(workers, queued))
        until_running(seen, pods, timeout)
        t_running = max(seen.running.values())
        wait(lambda: seen.status_at is not None, 30, "the job's status")
        stats = operator.settled(key)
        job = stats["jobs"][key]
        last_create = job["last_at"]["elasticps create pods"]
        listed = json.loads(kubectl(env, "get", "pods", "-n", ns, "-l", f"{LABEL_JOB}={JOB}", "-o", "json"))["items"]
        # Requests until every pod ran (the settled count also holds the passes that saw them run).
        result: dict[str, Any] = {
            "mode": "kueue" if queued else "operator",
            "workers": workers,
            "pods": pods,
            "load_1min": round(load, 2),
            "status_s": round(seen.status_at - t0, 3),  # type: ignore[operator]
            "last_create_s": round(last_create - t0, 3),
            **timings(seen, t0),
            "requests": job["total"],
            "requests_per_pod": round(job["total"] / pods, 3),
            "requests_by_kind": job["requests"],
            "peak_qps": peak(stats["per_second"], t0, t_running),
        }
        # Deletion: `kubectl delete` (background propagation, as by default) -> every pod gone.
        t_delete = time.time()
        kubectl(env, "delete", "trainingjob", JOB, "-n", ns, "--wait=false")
        wait(lambda: not seen.exist and len(seen.gone_at) >= pods, timeout, "every pod gone")
        after = operator.settled(key, quiet_s=1.5)["jobs"][key]
        result["delete_s"] = round(max(seen.gone_at.values()) - t_delete, 3)
        result["delete_requests"] = {
            k: v - job["requests"].get(k, 0) for k, v in after["requests"].items() if v != job["requests"].get(k, 0)
        }
    finally:
        stop.set()
        kubectl(env, "delete", "namespace", ns, "--wait=false")
    return result, [bare(p) for p in listed]


def floor_one(env: dict[str, str], manifests: list[dict[str, Any]], how: str, parallel: int, timeout: float) -> dict[str, Any]:
    """A floor: the same pods created without the operator, in a fresh namespace, so that the API
    server, etcd, the scheduler and kwok do its work alone. ``how``: ``kubectl``, ``parallel``
    ``kubectl create`` processes started together, each a share of the pods (what a user would
    type); ``client``, one process POSTing them on ``parallel`` connections at once with no client
    rate limit (the operator's transport without the operator)."""
    workers = len(manifests) - 2
    ns = namespace(env, f"floor-{how}", workers)
    seen, stop = observe(env, ns)
    client = api_client(env, parallel) if how == "client" else None
    try:
        load = os.getloadavg()[0]
        t0 = time.time()
        if client is None:
            create_by_kubectl(env, ns, manifests, parallel, timeout)
        else:
            create_by_client(client, ns, manifests, parallel)
        t_returned = time.time()
        until_running(seen, len(manifests), timeout)
        result = {"mode": f"floor-{how}", "workers": workers, "pods": len(manifests), "load_1min": round(load, 2),
                  "parallel": parallel, "returned_s": round(t_returned - t0, 3), **timings(seen, t0)}  # fmt: skip
        kubectl(env, "delete", "pods", "--all", "-n", ns, "--wait=false")
        wait(lambda: not seen.exist and len(seen.gone_at) >= len(manifests), timeout, "every pod gone")
    finally:
        stop.set()
        kubectl(env, "delete", "namespace", ns, "--wait=false")
    return result


def create_by_kubectl(env: dict[str, str], ns: str, manifests: list[dict[str, Any]], processes: int, timeout: float) -> None:
    shares = [manifests[i::processes] for i in range(processes) if manifests[i::processes]]
    running = [subprocess.Popen(["kubectl", "create", "-n", ns, "-f", "-", "-o", "name"], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for _ in shares]  # fmt: skip
    for process, share in zip(running, shares):
        assert process.stdin is not None
        process.stdin.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": share}))
        process.stdin.close()
    for process in running:
        if process.wait(timeout=timeout) != 0:
            raise RuntimeError(f"kubectl create: {process.stderr.read() if process.stderr else ''}")


def create_by_client(client: Any, ns: str, manifests: list[dict[str, Any]], connections: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def post(manifest: dict[str, Any]) -> None:
        request = client.param_serialize("POST", f"/api/v1/namespaces/{ns}/pods", body=manifest, auth_settings=["BearerToken"],
                                         header_params={"Content-Type": "application/json", "Accept": "application/json"})  # fmt: skip
        response = client.call_api(*request, _request_timeout=60)
        response.read()
        if response.status != 201:
            raise RuntimeError(f"POST pod {manifest['metadata']['name']}: {response.status} {response.data[:300]!r}")

    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(post, manifests))


# ---- outputs ------------------------------------------------------------------------------------------
def write_doc(doc: dict[str, Any]) -> None:
    lines = [
        "# The operator at scale",
        "",
        "<!-- generated by `make scale` (bench/operator_scale.py) from bench/results/operator_scale.json -->",
        "",
        f"A TrainingJob of 2 PS + N workers applied with `kubectl apply` on a kwok cluster "
        f"({doc['cluster']['nodes']} fake nodes x {doc['cluster']['pods_per_node']} pods; kube-scheduler and "
        f"kube-controller-manager at {doc['cluster']['component_qps']:g} QPS / burst {doc['cluster']['component_burst']}, "
        f"so neither is the bottleneck), the operator a real process. {doc['machine']}.",
        "",
        "- **status**: apply -> the job's first `.status` (Created, with its counts);",
        "- **last create**: apply -> the operator's last pod create (its own share);",
        "- **bound**: apply -> the last pod bound by the scheduler; **Running**: apply -> every pod Running (kwok);",
        "- **requests**: the operator's API requests for the job until then (kopf's included), and per pod;",
        "- **peak QPS**: its busiest wall-clock second (with a full bucket the first second may carry the burst "
        "and a second's worth of QPS); **delete**: `kubectl delete trainingjob` -> every pod gone;",
        "- **load**: the machine's 1-minute load average at apply. Everything (etcd, the API server, the scheduler, "
        "kwok, the operator, the watches measuring it) shares these CPUs, with whatever else runs on the "
        "machine: on a 2-CPU machine the API server's own work per pod (create, bind, status) is the larger "
        "part, and the figures move with the load.",
        "",
        "| operator QPS / burst | through | workers | load | status | last create | bound | Running | requests (per pod) | peak QPS | delete | delete requests |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for setting in doc["settings"]:
        for r in setting["runs"]:
            deletes = ", ".join(f"{k.split(' ', 1)[1]}: {v}" for k, v in sorted(r["delete_requests"].items()))
            lines.append(
                f"| {setting['qps']:g} / {setting['burst']} | {MODES[r.get('mode', 'operator')]} | {r['workers']} | "
                f"{r.get('load_1min', '-')} | {r['status_s']:.2f} s | "
                f"{r['last_create_s']:.2f} s | {r['last_bound_s']:.2f} s | {r['running_s']:.2f} s | "
                f"{r['requests']} ({r['requests_per_pod']:.2f}) | {r['peak_qps']} | {r['delete_s']:.2f} s | {deletes} |"
            )
    lines += ["", "Against the targets (the operator alone; the first QPS setting, as given; then the default):", ""]
    lines += [f"- {line}" for line in verdicts(doc)]
    if doc.get("floor"):
        lines += floor_section(doc)
    lines += [
        "",
        "How: creates go out concurrently (`--kube_api_concurrency`, default "
        f"{DEFAULT_CONCURRENCY}) through one client-side token bucket shared by every request of the operator, "
        f"kopf's included (`--kube_api_qps`/`--kube_api_burst`, default {DEFAULT_QPS:g}/{DEFAULT_BURST}: the "
        "kube-scheduler's own defaults, a rate every API server already takes from one client; client-go's 5/10 "
        "would take minutes for a 1,024-worker job). The status is patched before the first create; the next "
        "passes patch it again as pods come up. A pass that creates more than 10 objects of a kind posts one "
        "Event for the batch. A deleted job's pods go with one `deletecollection` (by the job's uid label), "
        "not one by one by the garbage collector.",
        "",
        "In Helm: `--set kubeApi.qps=400,kubeApi.burst=800` (values `kubeApi.qps`, `kubeApi.burst`, "
        "`kubeApi.concurrency`).",
        "",
        f"![time to Running](img/{IMAGE.name})",
        "",
        f"Raw results: `bench/results/{RESULTS.name}`. Run: `make scale` "
        "(`SCALE_ARGS='--workers 256,1024 --qps 400'`).",
        "",
    ]
    DOC.write_text("\n".join(lines))
    if doc.get("floor"):
        summary = [
            "## The operator at scale, against a floor",
            "",
            f"Written by `make scale` on {doc['date']} ({doc['machine']}): a TrainingJob of 2 PS + N workers on a kwok "
            "cluster, the time to its last pod created and to every pod Running over the same pods created without "
            f"the operator, in the same sitting (goal <= {GOAL:g}x). How, and every run: "
            f"[operator-scale.md]({DOC.name}).",
            "",
            *ratio_table(doc),
        ]
        write_region(BENCHMARKS, "operator-scale", "\n".join(summary))


TARGETS = (  # (workers, figure, at most seconds)
    (1024, "last_create_s", 5.0),
    (1024, "running_s", 10.0),
    (256, "running_s", 2.5),
)
WORDS = {"last_create_s": "last create", "running_s": "every pod Running", "status_s": "status visible"}


def verdicts(doc: dict[str, Any]) -> list[str]:
    """Each target against the median of its runs (with their range when there are several)."""
    out = []
    for setting in doc["settings"]:
        runs: dict[int, list[dict[str, Any]]] = {}
        for r in setting["runs"]:
            if r.get("mode", "operator") == "operator":
                runs.setdefault(r["workers"], []).append(r)
        checks = [(w, f, limit) for w, f, limit in TARGETS if w in runs]
        checks += [(w, "status_s", 1.0) for w in sorted(runs)]
        parts = []
        for workers, figure, limit in checks:
            values = sorted(r[figure] for r in runs[workers])
            value = statistics.median(values)
            spread = f" ({values[0]:.2f}-{values[-1]:.2f} over {len(values)} runs)" if len(values) > 1 else ""
            parts.append(f"{workers} workers, {WORDS[figure]} {value:.2f} s{spread} (<= {limit:g} s: {'yes' if value <= limit else 'NO'})")
        big = runs[max(runs)][0] if runs else None
        extra = f"; {big['requests_per_pod']:.2f} requests per pod, peak {big['peak_qps']} QPS at {big['workers']} workers" if big else ""
        out.append(f"QPS {setting['qps']:g} / burst {setting['burst']}: " + "; ".join(parts) + extra)
    return out


MODES = {"operator": "operator", "kueue": "Kueue, then operator",
         "floor-kubectl": "kubectl create", "floor-client": "bare client"}  # fmt: skip
FLOORS = ("floor-kubectl", "floor-client")
GOAL = 1.2  # the operator's time as a multiple of the bare-create floor's, at most


def ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each setting's and mode's median time to the last pod created and to every pod Running, over
    each floor's median at the same size (the floor runs interleave with the others, in the same
    sitting): ``row[floor]["running_ratio"]`` ..."""
    floors: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in doc.get("floor", []):
        floors.setdefault((r["mode"], r["workers"]), []).append(r)
    out = []
    for setting in doc["settings"]:
        for mode in ("operator", "kueue"):
            for workers in sorted({w for _, w in floors}):
                runs = [r for r in setting["runs"] if r.get("mode", "operator") == mode and r["workers"] == workers]
                if not runs:
                    continue
                row: dict[str, Any] = {"qps": setting["qps"], "burst": setting["burst"], "mode": mode, "workers": workers,
                                       "runs": len(runs)}  # fmt: skip
                for figure in ("created_s", "running_s"):
                    row[figure] = statistics.median(r[figure] for r in runs)
                for kind in FLOORS:
                    base = floors.get((kind, workers))
                    if base:
                        row[kind] = {"runs": len(base)}
                        for figure in ("created_s", "running_s"):
                            value = statistics.median(r[figure] for r in base)
                            row[kind][figure] = value
                            row[kind][f"{figure.removesuffix('_s')}_ratio"] = round(row[figure] / value, 3)
                out.append(row)
    return out


def floor_section(doc: dict[str, Any]) -> list[str]:
    parallel = {r["mode"]: r["parallel"] for r in doc["floor"]}
    lines = [
        "",
        "## Against the floor: the same pods without the operator",
        "",
        "In the same sitting, interleaved with the runs above, the pods the operator made for its first job of "
        "each size are created again without it, in a fresh namespace: the API server, etcd, the scheduler and "
        "kwok doing the same work alone. Two floors:",
        "",
        f"- **kubectl create**: {parallel.get('floor-kubectl', '-')} `kubectl create` processes started together, "
        "each a share of the pods (what a user would type; each process sends its creates one after another);",
        f"- **bare client**: one Python process POSTing the pods on {parallel.get('floor-client', '-')} connections "
        "at once, with no client-side rate limit (the operator's transport without the operator).",
        "",
        "Every mode is timed by the same pod watch, from just before its first command (`kubectl apply` of the "
        "job, the `kubectl create`s, the first POST): **created**, the last pod's ADDED event; **Running**, "
        "the last pod Running. "
        + ("Through Kueue, the job waits for its Workload's admission first (one ClusterQueue with quota for it, "
           "the operator started with `--kueue`). " if doc.get("kueue") else "")
        + f"The goal: at most {GOAL:g}x the floor. Each kubectl process sends its creates one after another "
        "and spends CPU of its own on this shared machine, so the operator's concurrent creates usually beat "
        "that floor; the bare client is the stricter one. At the operator's default QPS the larger jobs are "
        "paced by its own token bucket (`kubeApi.qps`), not by the cluster.",
        "",
        "| floor | workers | load | returned | created | bound | Running |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["floor"]:
        lines.append(f"| {MODES.get(r['mode'], r['mode'])} | {r['workers']} | {r['load_1min']} | {r['returned_s']:.2f} s | "
                     f"{r['created_s']:.2f} s | {r['last_bound_s']:.2f} s | {r['running_s']:.2f} s |")
    return [*lines, "", "Medians, and each over the floor's median at the same size:", "", *ratio_table(doc)]


def ratio_table(doc: dict[str, Any]) -> list[str]:
    """Each setting's and mode's medians over each floor's (:func:`ratios`), as a Markdown table."""
    lines = [
        "| operator QPS / burst | through | workers | runs | created | / kubectl | / bare client | Running | / kubectl | / bare client |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(row: dict[str, Any], kind: str, figure: str) -> str:
        if kind not in row:
            return "-"
        value = row[kind][figure]
        return f"{value:.2f}x" + ("" if value <= GOAL else " (over)")

    for row in ratios(doc):
        lines.append(
            f"| {row['qps']:g} / {row['burst']} | {MODES[row['mode']]} | {row['workers']} | {row['runs']} | "
            f"{row['created_s']:.2f} s | {ratio(row, 'floor-kubectl', 'created_ratio')} | {ratio(row, 'floor-client', 'created_ratio')} | "
            f"{row['running_s']:.2f} s | {ratio(row, 'floor-kubectl', 'running_ratio')} | {ratio(row, 'floor-client', 'running_ratio')} |"
        )
    return lines


def plot(doc: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ratios(doc)
    fig, axes = plt.subplots(1, 2 if rows else 1, figsize=(13 if rows else 7.5, 4.2), squeeze=False)
    ax = axes[0][0]
    for setting, marker in zip(doc["settings"], "os^"):
        runs = [r for r in setting["runs"] if r.get("mode", "operator") == "operator"]
        label = f"QPS {setting['qps']:g}/{setting['burst']}"
        xs = sorted({r["workers"] for r in runs})

        def median(figure: str, runs: list[dict[str, Any]] = runs, xs: list[int] = xs) -> list[float]:
            return [statistics.median(r[figure] for r in runs if r["workers"] == w) for w in xs]

        ax.plot(xs, median("running_s"), marker=marker, label=f"{label}: all Running")
        ax.plot(xs, median("last_create_s"), marker=marker, linestyle="--", label=f"{label}: last create")
    for kind, style in zip(FLOORS, (":", "-.")):
        floor = [r for r in doc.get("floor", []) if r["mode"] == kind]
        xs = sorted({r["workers"] for r in floor})
        if xs:
            ax.plot(xs, [statistics.median(r["running_s"] for r in floor if r["workers"] == w) for w in xs],
                    marker="x", color="black", linestyle=style, label=f"{MODES[kind]} alone: all Running")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers (+ 2 PS)")
    ax.set_ylabel("seconds after kubectl apply")
    ax.set_title("elasticps operator on a kwok cluster")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if rows:
        ax = axes[0][1]
        first = doc["settings"][0]["qps"]
        shown = [r for r in rows if r["qps"] == first]
        sizes = sorted({r["workers"] for r in shown})
        series = [(mode, kind) for mode in ("operator", "kueue") for kind in FLOORS if any(r["mode"] == mode for r in shown)]
        width = 0.8 / max(len(series), 1)
        for i, (mode, kind) in enumerate(series):
            values = [next((r[kind]["running_ratio"] for r in shown if (r["mode"], r["workers"]) == (mode, n) and kind in r), 0.0)
                      for n in sizes]  # fmt: skip
            ax.bar([x + i * width for x in range(len(sizes))], values, width,
                   label=f"{MODES[mode]} / {MODES[kind]}", hatch="//" if kind == "floor-kubectl" else None)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(GOAL, color="red", linestyle="--", linewidth=0.8, label=f"goal {GOAL:g}x")
        ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(sizes))], [f"{n} workers" for n in sizes])
        ax.set_ylabel("all Running, x the floor's")
        ax.set_title(f"against the floors, same sitting (QPS {first:g})")
        ax.grid(True, axis="y", alpha=0.3)
        top = max((r[kind]["running_ratio"] for r in shown for kind in FLOORS if kind in r), default=GOAL)
        ax.set_ylim(0, max(top, GOAL) * 1.5)
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    fig.tight_layout()
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGE, dpi=110)


def record(runs: list[dict[str, Any]], result: dict[str, Any], what: str) -> None:
    runs.append(result)
    figures = [f"{key.removesuffix('_s').replace('_', ' ')} {result[key]:.2f} s"
               for key in ("status_s", "last_create_s", "created_s", "running_s", "delete_s") if key in result]
    if "requests" in result:
        figures.append(f"{result['requests']} requests ({result['requests_per_pod']:.2f}/pod), peak {result['peak_qps']} QPS")
    log(f"{what}: {result['workers']} workers: " + ", ".join(figures))
    time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="256,1024", help="comma-separated worker counts")
    parser.add_argument("--qps", type=float, default=400.0, help="the operator's QPS for the first pass of runs")
    parser.add_argument("--burst", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--skip_default", action="store_true", help="do not also run at the operator's defaults")
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--pods_per_node", type=int, default=110)
    parser.add_argument("--component_qps", type=float, default=1000.0)
    parser.add_argument("--component_burst", type=int, default=2000)
    parser.add_argument("--kwok_parallelism", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each worker count (the targets use the median)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--floor_processes", type=int, default=8,
                        help="kubectl processes that create the kubectl floor's pods together")
    parser.add_argument("--floor_connections", type=int, default=32,
                        help="connections on which the client floor creates its pods at once")
    parser.add_argument("--no_kueue", dest="kueue", action="store_false",
                        help="no Kueue in the cluster and no run through it")
    parser.add_argument("--no_docs", action="store_true", help="write the JSON only")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="use this running cluster (tuned as above) instead of starting one")
    parser.add_argument("--docs_only", action="store_true", help="rewrite the doc and plot from the JSON")
    args = parser.parse_args()
    if args.docs_only:
        written: dict[str, Any] = json.loads(RESULTS.read_text())
        write_doc(written)
        plot(written)
        return
    counts = [int(w) for w in args.workers.split(",")]
    if max(counts) + 2 > args.nodes * args.pods_per_node:
        sys.exit(f"{max(counts) + 2} pods do not fit on {args.nodes} nodes x {args.pods_per_node}")
    settings = [(args.qps, args.burst, args.concurrency)]
    if not args.skip_default:
        settings.append((DEFAULT_QPS, DEFAULT_BURST, DEFAULT_CONCURRENCY))

    workdir = Path(tempfile.mkdtemp(prefix="elasticps-scale-"))
    state_dir = workdir / "cluster"
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "cluster": {"nodes": args.nodes, "pods_per_node": args.pods_per_node, "component_qps": args.component_qps,
                    "component_burst": args.component_burst},  # fmt: skip
        "settings": [],
        "floor": [],
        "kueue": args.kueue,
    }
    log(f"cluster: {args.nodes} kwok nodes x {args.pods_per_node} pods, components at {args.component_qps:g} QPS")
    if args.kubeconfig:
        env = {**os.environ, "KUBECONFIG": str(args.kubeconfig.resolve())}
    else:
        env = cluster_up(state_dir, args)
    ok = False
    try:
        kubectl(env, "apply", "-f", str(REPO / "manifests" / "crd.yaml"))
        established = '{.status.conditions[?(@.type=="Established")].status}'
        wait(lambda: subprocess.run(["kubectl", "get", "crd/trainingjobs.elasticps.io", "-o", f"jsonpath={established}"],
                                    env=env, capture_output=True, text=True).stdout == "True", 60, "the CRD")  # fmt: skip
        if args.kueue:
            kubectl(env, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": queue_objects()}))
        floors: dict[int, list[dict[str, Any]]] = {}  # the floor's pods: the operator's first job's at that size
        for qps, burst, concurrency in settings:
            operator = Operator(env, workdir, qps, burst, concurrency, args.kueue)
            setting: dict[str, Any] = {"qps": qps, "burst": burst, "concurrency": concurrency, "runs": []}
            doc["settings"].append(setting)
            try:
                time.sleep(3)  # kopf has listed and opened its watches
                for workers in [w for w in counts for _ in range(args.repeats)]:
                    # Interleaved, so the machine's drift falls on every mode alike.
                    result, pods = run_one(env, operator, workers, args.timeout)
                    record(setting["runs"], result, f"QPS {qps:g}")
                    floors.setdefault(workers, pods)
                    for how, parallel in (("kubectl", args.floor_processes), ("client", args.floor_connections)):
                        record(doc["floor"], floor_one(env, floors[workers], how, parallel, args.timeout), f"floor ({how})")
                    if args.kueue:
                        record(setting["runs"], run_one(env, operator, workers, args.timeout, queued=True)[0],
                               f"QPS {qps:g} through Kueue")
                    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
            finally:
                operator.stop()
        ok = True
    finally:
        if not args.kubeconfig:
            subprocess.run([sys.executable, str(CLUSTER_PY), "down"], env=env, capture_output=True, text=True)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"the operator's logs and request counts are kept in {workdir}")
    if not args.no_docs:
        write_doc(doc)
        plot(doc)
    log(f"wrote {RESULTS.relative_to(REPO)}" + ("" if args.no_docs else f", {DOC.relative_to(REPO)}, {IMAGE.relative_to(REPO)}"))


if __name__ == "__main__":
    main()
