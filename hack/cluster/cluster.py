#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback, with kwok fake nodes.

    python3 hack/cluster/cluster.py up      # start (or report the running one)
    python3 hack/cluster/cluster.py env     # print `export KUBECONFIG=...`
    python3 hack/cluster/cluster.py status
    python3 hack/cluster/cluster.py down [--purge]

Why this exists: end-to-end tests of the operator need the real apiserver
(CRD schemas, CEL rules, RBAC, watch semantics), the real scheduler (GPU
capacity, Pending/Unschedulable) and the real controller-manager (garbage
collection, namespace deletion) - but the project's machines have no
container runtime to run kubelets and no network to fetch a kind image. kwok
plays the kubelets: it keeps fake Nodes Ready and moves pods bound to them
to Running, so nothing ever executes a container.

Binaries come from hack/cluster/build.sh (built from Go modules, cached under
~/.cache/elasticps). Everything listens on 127.0.0.1 on ports picked free at
start-up, so parallel runs and other people's services do not collide.

Environment:
  ELASTICPS_CLUSTER_DIR  state dir (default ~/.cache/elasticps/cluster-run)
  KUBEBUILDER_ASSETS     envtest-style dir; binaries found there are used first
  ELASTICPS_CLUSTER_BIN  dir holding the binaries (default: build.sh's
                         assets dir for the versions pinned in versions.sh)
  CPU_NODES, GPU_NODES, GPUS_PER_NODE   fake node layout (3, 1, 2)

Python 3.11 standard library only, so it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE_DIR = Path(
    os.environ.get("ELASTICPS_CLUSTER_DIR")
    or Path.home() / ".cache" / "elasticps" / "cluster-run"
)
# Start order; `down` stops in reverse so nothing loses its apiserver first.
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bin_dir() -> Path:
    env = os.environ.get("ELASTICPS_CLUSTER_BIN")
    if env:
        return Path(env)
    # versions.sh is the single source of the pinned versions; ask bash for
    # the derived path rather than duplicating the naming scheme here.
    out = subprocess.run(
        ["bash", "-c", f'source "{HERE}/versions.sh" && printf %s "$ASSETS_DIR"'],
        check=True, capture_output=True, text=True,
    )
    return Path(out.stdout)


def binary(name: str) -> str:
    # envtest's convention: binaries a user brought (setup-envtest gives kube-apiserver, etcd,
    # kubectl) win over ours; the rest still comes from the cache.
    brought = os.environ.get("KUBEBUILDER_ASSETS")
    if brought and os.access(Path(brought) / name, os.X_OK):
        return str(Path(brought) / name)
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        sys.exit(f"{path} missing: run hack/cluster/build.sh first (or set ELASTICPS_CLUSTER_BIN)")
    return str(path)


def free_port() -> int:
    # Ask the kernel for a free loopback port. A tiny race remains until the
    # component binds it; acceptable for a test cluster.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(pki: Path) -> None:
    """CA, apiserver serving cert and service-account key pair, via openssl.

    Our own CA (instead of the apiserver's self-signed cert) means the
    kubeconfig can be written before the apiserver starts and stays valid
    across down/up. Kept when it already exists for the same reason.
    """
    if (pki / "apiserver.crt").exists() and (pki / "sa.pub").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
        "-subj", "/CN=elasticps-test-ca", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
        "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"))
    ext = pki / "apiserver.ext"
    # The in-cluster names matter to clients that resolve kubernetes.default.
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    run("openssl", "x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", str(ext), "-out", str(pki / "apiserver.crt"))
    # Service-account tokens are signed with this key (apiserver) and the
    # token controller (controller-manager) needs the private half too.
    run("openssl", "genrsa", "-out", str(pki / "sa.key"), "2048")
    run("openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_auth(state: Path) -> str:
    """Static token in group system:masters: full admin without client certs."""
    token_file = state / "admin.token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(24))
        os.chmod(token_file, 0o600)
    token = token_file.read_text().strip()
    tokens_csv = state / "tokens.csv"
    tokens_csv.write_text(f'{token},admin,admin-uid,"system:masters"\n')
    os.chmod(tokens_csv, 0o600)
    return token


def write_kubeconfig(path: Path, port: int, ca: Path, token: str) -> None:
    # JSON is valid YAML, and kubectl/client-go/kopf read it as a kubeconfig.
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "elasticps", "cluster": {
            "server": f"https://127.0.0.1:{port}", "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "elasticps", "context": {"cluster": "elasticps", "user": "admin"}}],
        "current-context": "elasticps",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    os.chmod(path, 0o600)


class Api:
    """Just enough of a REST client to wait for readiness and create nodes."""

    def __init__(self, port: int, ca: Path, token: str):
        self.base = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict | str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=5) as r:
                raw = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read().decode(), e.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None, logfile: Path | None = None) -> float:
    t0 = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except (OSError, urllib.error.URLError, ssl.SSLError):
            pass
        if proc is not None and proc.poll() is not None:
            tail = logfile.read_text()[-3000:] if logfile else ""
            sys.exit(f"{what}: process exited with {proc.returncode}\n{tail}")
        if time.monotonic() - t0 > timeout:
            sys.exit(f"timed out after {timeout:.0f}s waiting for {what} (logs: {STATE_DIR / 'logs'})")
        time.sleep(0.2)


def http_ok(url: str, insecure: bool = False) -> bool:
    ctx = None
    if url.startswith("https"):
        # kcm and scheduler serve /healthz on a self-signed cert of their own;
        # only liveness matters here, not their identity.
        ctx = ssl._create_unverified_context() if insecure else ssl.create_default_context()
    with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
        return r.status == 200


def start(name: str, args: list[str], logs: Path) -> subprocess.Popen:
    logfile = logs / f"{name}.log"
    out = open(logfile, "ab")
    # New session: the components outlive this script and a Ctrl-C in the
    # caller's terminal does not tear half the cluster down.
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=STATE_DIR)
    out.close()
    return proc


def node_manifest(name: str, cpu: str, memory: str, gpus: int) -> dict:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "labels": labels,
            # kwok manages only nodes carrying this annotation (see --manage-
            # nodes-with-annotation-selector), so real nodes are never touched.
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        # No kwok NoSchedule taint: every node here is fake, and the
        # operator's pods must schedule without special tolerations.
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                "kubeletVersion": "fake", "kubeProxyVersion": "fake"}},
    }


def load_state() -> dict | None:
    try:
        return json.loads((STATE_DIR / "state.json").read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int, exe: str) -> bool:
    # Compare the command line too, so a recycled pid is never signalled.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == exe


def running(state: dict | None) -> bool:
    return bool(state) and all(alive(c["pid"], c["exe"]) for c in state["components"].values())


def env_lines(state: dict) -> str:
    return f"export KUBECONFIG={state['kubeconfig']}\nexport PATH={state['bin']}:$PATH\n"


def cmd_up(args: argparse.Namespace) -> None:
    state = load_state()
    if running(state):
        log("already running")
        print(env_lines(state), end="")
        return
    if state:
        log("stale state from an earlier run: stopping leftovers")
        stop(state)
    t_start = time.monotonic()
    exe = {n: binary(n) for n in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]}
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    logs = STATE_DIR / "logs"
    # A fresh etcd each `up`: tests must not see objects of an earlier run.
    for d in ("etcd", "logs"):
        shutil.rmtree(STATE_DIR / d, ignore_errors=True)
    logs.mkdir()
    pki = STATE_DIR / "pki"
    make_pki(pki)
    token = write_auth(STATE_DIR)
    ports = {k: free_port() for k in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok")}
    kubeconfig = STATE_DIR / "kubeconfig"
    write_kubeconfig(kubeconfig, ports["apiserver"], pki / "ca.crt", token)
    kc = str(kubeconfig)
    api = Api(ports["apiserver"], pki / "ca.crt", token)
    procs: dict[str, subprocess.Popen] = {}
    state = {"bin": str(bin_dir()), "kubeconfig": kc, "ports": ports, "components": {}}

    def record(name: str, proc: subprocess.Popen) -> None:
        procs[name] = proc
        state["components"][name] = {"pid": proc.pid, "exe": exe[name]}
        # Written after every start so `down` can clean up a half-started cluster.
        (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")

    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
    record("etcd", start("etcd", [
        exe["etcd"], "--name=default", f"--data-dir={STATE_DIR / 'etcd'}",
        f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        # Throw-away data: skipping fsync keeps slow CI disks from stalling writes.
        "--unsafe-no-fsync=true", "--log-level=warn",
    ], logs))
    t = wait_for("etcd", lambda: http_ok(f"{etcd_url}/health"), 30, procs["etcd"], logs / "etcd.log")
    log(f"etcd healthy after {t:.1f}s")

    record("kube-apiserver", start("kube-apiserver", [
        exe["kube-apiserver"], f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--cert-dir={pki}",
        f"--token-auth-file={STATE_DIR / 'tokens.csv'}", "--authorization-mode=RBAC",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        # Virtual IPs only: no kube-proxy exists, so nothing ever routes to them.
        "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true", "--profiling=false",
        # The `kubernetes` Service's endpoint would be 127.0.0.1, which
        # Endpoints validation rejects every 10 s; no pod here needs it.
        "--endpoint-reconciler-type=none",
        # kcm and the scheduler read this CA from extension-apiserver-
        # authentication and log errors without it; no front proxy uses it.
        f"--requestheader-client-ca-file={pki / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
    ], logs))
    t = wait_for("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, 120,
                 procs["kube-apiserver"], logs / "kube-apiserver.log")
    t_api = time.monotonic() - t_start
    log(f"kube-apiserver ready after {t:.1f}s ({t_api:.1f}s since up)")

    record("kube-controller-manager", start("kube-controller-manager", [
        exe["kube-controller-manager"], f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kcm']}",
        # One instance only: leader election would just add a lease wait.
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
    ], logs))
    record("kube-scheduler", start("kube-scheduler", [
        exe["kube-scheduler"], f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}", "--leader-elect=false",
    ], logs))
    record("kwok", start("kwok", [
        exe["kwok"], f"--kubeconfig={kc}",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        # Node addresses are what the apiserver dials for logs/exec: keep them
        # on loopback. Pod IPs are fake and never dialled (no kube-proxy/CNI).
        "--node-ip=127.0.0.1", f"--node-port={ports['kwok']}", "--cidr=10.244.0.1/16",
        # Heartbeats through node Leases, as kubelets do. Without this flag kwok v0.7.0 renews no
        # Lease yet picks its lease-based heartbeat stage (node status every ~10-20 min), so the
        # node lifecycle controller marks every node NotReady a few minutes after `up`: pods lose
        # their Ready condition (kwok never restores it) and get the unreachable NoExecute taint.
        "--node-lease-duration-seconds=40",
    ], logs))
    for name, url in (("kube-controller-manager", f"https://127.0.0.1:{ports['kcm']}/healthz"),
                      ("kube-scheduler", f"https://127.0.0.1:{ports['scheduler']}/healthz"),
                      ("kwok", f"http://127.0.0.1:{ports['kwok']}/healthz")):
        t = wait_for(name, lambda u=url: http_ok(u, insecure=True), 60, procs[name], logs / f"{name}.log")
        log(f"{name} healthy ({time.monotonic() - t_start:.1f}s since up)")

    cpu_nodes = int(os.environ.get("CPU_NODES", "3"))
    gpu_nodes = int(os.environ.get("GPU_NODES", "1"))
    gpus = int(os.environ.get("GPUS_PER_NODE", "2"))
    names = []
    for i in range(cpu_nodes):
        names.append(f"kwok-cpu-{i}")
        manifest = node_manifest(names[-1], "8", "32Gi", 0)
        code, body = api.call("POST", "/api/v1/nodes", manifest)
        if code not in (201, 409):
            sys.exit(f"creating node {names[-1]}: {code} {body}")
    for i in range(gpu_nodes):
        names.append(f"kwok-gpu-{i}")
        code, body = api.call("POST", "/api/v1/nodes", node_manifest(names[-1], "16", "64Gi", gpus))
        if code not in (201, 409):
            sys.exit(f"creating node {names[-1]}: {code} {body}")

    def nodes_ready() -> bool:
        code, body = api.call("GET", "/api/v1/nodes")
        ready = {
            n["metadata"]["name"] for n in body.get("items", [])
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        }
        return set(names) <= ready

    wait_for("fake nodes Ready", nodes_ready, 60, procs["kwok"], logs / "kwok.log")
    # The scheduler ignores nodes until the node lifecycle controller lifts
    # the not-ready/uninitialised taints it starts them with; wait for that
    # too, or the first pod of a test may be reported Unschedulable.
    def untainted() -> bool:
        _, body = api.call("GET", "/api/v1/nodes")
        return all(not n.get("spec", {}).get("taints") for n in body.get("items", [])
                   if n["metadata"]["name"] in names)

    wait_for("node taints cleared", untainted, 60)
    # Pods are rejected by ServiceAccount admission until the controller-
    # manager has created the namespace's `default` ServiceAccount.
    wait_for("default ServiceAccount",
             lambda: api.call("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200, 60)
    t_total = time.monotonic() - t_start
    state["timings"] = {"apiserver_ready_s": round(t_api, 2), "cluster_ready_s": round(t_total, 2)}
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    log(f"{len(names)} fake nodes Ready; cluster ready {t_total:.1f}s after up "
        f"(apiserver {t_api:.1f}s); logs in {logs}")
    print(env_lines(state), end="")


def stop(state: dict) -> None:
    for name in reversed(COMPONENTS):
        c = state.get("components", {}).get(name)
        if not c or not alive(c["pid"], c["exe"]):
            continue
        os.kill(c["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 15
        while alive(c["pid"], c["exe"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(c["pid"], c["exe"]):
            log(f"{name} ignored SIGTERM; killing")
            os.kill(c["pid"], signal.SIGKILL)
        log(f"stopped {name} (pid {c['pid']})")
    (STATE_DIR / "state.json").unlink(missing_ok=True)


def cmd_down(args: argparse.Namespace) -> None:
    state = load_state()
    if state:
        stop(state)
    else:
        log("nothing running")
    if args.purge:
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        log(f"removed {STATE_DIR}")


def cmd_env(args: argparse.Namespace) -> None:
    state = load_state()
    if not running(state):
        sys.exit("cluster is not running: hack/cluster/cluster.py up")
    print(env_lines(state), end="")


def cmd_status(args: argparse.Namespace) -> None:
    state = load_state()
    if not state:
        sys.exit("not running")
    ok = True
    for name in COMPONENTS:
        c = state["components"].get(name)
        up = bool(c) and alive(c["pid"], c["exe"])
        ok &= up
        print(f"{name:25} {'running' if up else 'DOWN'}  pid {c['pid'] if c else '-'}")
    print(f"kubeconfig {state['kubeconfig']}; ports {state['ports']}")
    sys.exit(0 if ok else 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up").set_defaults(fn=cmd_up)
    d = sub.add_parser("down")
    d.add_argument("--purge", action="store_true", help="also delete the state dir (keys, token, logs)")
    d.set_defaults(fn=cmd_down)
    sub.add_parser("env").set_defaults(fn=cmd_env)
    sub.add_parser("status").set_defaults(fn=cmd_status)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
