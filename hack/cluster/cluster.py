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

`up --cpu-nodes N --pods-per-node P` sizes the fake nodes for scale tests (P is each node's pod
capacity, 110 by default as a kubelet's maxPods); `up --kube-api-qps Q --kube-api-burst B` raises the
client rates of kube-scheduler and kube-controller-manager (their defaults are 50/100 and 20/30), and
`--kwok-parallelism N` kwok's (its pods move to Running 4 at a time by default), so a scale test
measures the operator, not the scheduler's, the garbage collector's or kwok's own limits.

`up --real-node` adds one real node (hack/cluster/realnode.py): containerd, kubelet, kube-proxy
and CoreDNS on this machine, as root, also to a cluster already up (its apiserver restarts to
listen on the node's bridge; etcd and what it holds stay); `load-image REF` copies an image from
the local Docker engine into its containerd. `down --purge` also takes away what the real node
left on the host (the bridge, the kubelet's and CNI's iptables chains).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kueue  # noqa: E402
import realnode  # noqa: E402

HERE = Path(__file__).resolve().parent
STATE_DIR = Path(
    os.environ.get("ELASTICPS_CLUSTER_DIR")
    or Path.home() / ".cache" / "elasticps" / "cluster-run"
)
# The real node's parts listen on these (picked free when it starts).
REAL_NODE_PORTS = ["kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics",
                   "coredns-health", "coredns-ready"]
# Start order; `down` stops in reverse so nothing loses its apiserver first.
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              "containerd", "coredns", "kube-proxy", "kubelet", "kueue", "coscheduler", "coscheduler-controller"]
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


APISERVER_SANS = (
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,"
    # Pods on the real node dial the `kubernetes` Service's ClusterIP (kube-proxy DNATs it to the
    # apiserver advertised on the node's bridge address).
    f"IP:{realnode.KUBERNETES_SERVICE_IP},IP:{realnode.NODE_IP}\n"
    "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
)


def make_pki(pki: Path) -> None:
    """CA, apiserver serving cert and service-account key pair, via openssl.

    Our own CA (instead of the apiserver's self-signed cert) means the
    kubeconfig can be written before the apiserver starts and stays valid
    across down/up. Kept when it already exists for the same reason.
    """
    ext = pki / "apiserver.ext"
    if (pki / "apiserver.crt").exists() and (pki / "sa.pub").exists() and (pki / "kubelet-client.crt").exists() \
            and ext.exists() and ext.read_text() == APISERVER_SANS:
        return
    if (pki / "ca.crt").exists() and (pki / "sa.pub").exists():
        # An older state dir: keep CA and keys, (re)issue the certs with the current SANs.
        issue_certs(pki)
        return
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
        "-subj", "/CN=elasticps-test-ca", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    # Service-account tokens are signed with this key (apiserver) and the
    # token controller (controller-manager) needs the private half too.
    run("openssl", "genrsa", "-out", str(pki / "sa.key"), "2048")
    run("openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    issue_certs(pki)


def issue_certs(pki: Path) -> None:
    """The apiserver's serving cert and its client cert towards kubelets, signed by our CA."""
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
        "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"))
    ext = pki / "apiserver.ext"
    # The in-cluster names matter to clients that resolve kubernetes.default.
    ext.write_text(APISERVER_SANS)
    run("openssl", "x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", str(ext), "-out", str(pki / "apiserver.crt"))
    # logs/exec/port-forward: the apiserver authenticates to the kubelet with this (system:masters,
    # as kubeadm's apiserver-kubelet-client), the kubelet trusts our CA for client certs.
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes",
        "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
        "-keyout", str(pki / "kubelet-client.key"), "-out", str(pki / "kubelet-client.csr"))
    cext = pki / "kubelet-client.ext"
    cext.write_text("extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
    run("openssl", "x509", "-req", "-in", str(pki / "kubelet-client.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", str(cext), "-out", str(pki / "kubelet-client.crt"))


def write_auth(state: Path) -> str:
    """Static token in group system:masters: full admin without client certs."""
    token_file = state / "admin.token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(24))
        os.chmod(token_file, 0o600)
    token = token_file.read_text().strip()
    tokens_csv = state / "tokens.csv"
    lines = [f'{token},admin,admin-uid,"system:masters"']
    # The real node's components, each with the identity the apiserver's default RBAC (and the Node
    # authorizer) expects of it; unused on kwok-only clusters.
    for name, (user, groups) in SYSTEM_USERS.items():
        lines.append(f'{system_token(state, name)},{user},{user}-uid,"{groups}"')
    tokens_csv.write_text("\n".join(lines) + "\n")
    os.chmod(tokens_csv, 0o600)
    return token


SYSTEM_USERS = {
    "kubelet": (f"system:node:{realnode.NODE_NAME}", "system:nodes,system:authenticated"),
    "kube-proxy": ("system:kube-proxy", "system:authenticated"),
    "coredns": ("system:coredns", "system:authenticated"),
}


def system_token(state: Path, name: str) -> str:
    path = state / f"{name}.token"
    if not path.exists():
        path.write_text(secrets.token_hex(24))
        os.chmod(path, 0o600)
    return path.read_text().strip()


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


def unestablished(api: Api, plurals: tuple[str, ...], group: str) -> dict[str, object]:
    """The CRDs of ``plurals`` in ``group`` that are not Established yet, with their conditions (or
    the API's answer when reading one failed)."""
    out: dict[str, object] = {}
    for plural in plurals:
        code, body = api.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}")
        conditions = ((body.get("status") or {}).get("conditions") or []) if code == 200 and isinstance(body, dict) else []
        if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            out[plural] = [(c.get("type"), c.get("status"), c.get("message")) for c in conditions] if code == 200 \
                else f"{code} {str(body)[:300]}"
    return out


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None, logfile: Path | None = None,
             on_timeout=None) -> float:
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
            said = f": {on_timeout()}" if on_timeout else ""
            sys.exit(f"timed out after {timeout:.0f}s waiting for {what}{said} (logs: {STATE_DIR / 'logs'})")
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


def node_manifest(name: str, cpu: str, memory: str, gpus: int, pods: int = 110) -> dict:
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "100Gi"}
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


def apiserver_args(exe: str, etcd_url: str, port: int, pki: Path, real: bool) -> list[str]:
    """kube-apiserver's command line: on loopback, or (``real``) where the real node's pods reach it."""
    if real:
        # Pods reach the apiserver through the `kubernetes` Service, whose endpoint is the advertise
        # address: the node's bridge address (an address on this machine that pods can route to).
        # It must listen there too, and 127.0.0.1 stays for kubectl: hence 0.0.0.0.
        where = ["--bind-address=0.0.0.0", f"--advertise-address={realnode.NODE_IP}",
                 "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                 f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                 f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                 # The node's Hostname address (real-node-0) resolves nowhere; its InternalIP does.
                 "--kubelet-preferred-address-types=InternalIP,Hostname"]
    else:
        where = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--authorization-mode=RBAC",
                 # The `kubernetes` Service's endpoint would be 127.0.0.1, which
                 # Endpoints validation rejects every 10 s; no pod here needs it.
                 "--endpoint-reconciler-type=none"]
    return [
        exe, f"--etcd-servers={etcd_url}", *where, f"--secure-port={port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--cert-dir={pki}",
        f"--token-auth-file={STATE_DIR / 'tokens.csv'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        # Virtual IPs only: no kube-proxy exists, so nothing ever routes to them.
        f"--service-cluster-ip-range={realnode.SERVICE_CIDR}", "--allow-privileged=true", "--profiling=false",
        # kcm and the scheduler read this CA from extension-apiserver-
        # authentication and log errors without it; no front proxy uses it.
        f"--requestheader-client-ca-file={pki / 'ca.crt'}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
    ]


def start_apiserver(exe: str, etcd_url: str, port: int, pki: Path, logs: Path, real: bool) -> subprocess.Popen:
    """kube-apiserver started; for a real node, once the host has its bridge to listen on."""
    if real:
        realnode.host_setup()
    return start("kube-apiserver", apiserver_args(exe, etcd_url, port, pki, real), logs)


def recorder(state: dict, exe: dict[str, str], procs: dict[str, subprocess.Popen]):
    """``record(name, proc)``: a started component kept in ``procs`` and in the state file, written
    after every start so `down` can clean up a half-started cluster."""
    def record(name: str, proc: subprocess.Popen) -> None:
        procs[name] = proc
        state["components"][name] = {"pid": proc.pid, "exe": exe[name]}
        (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    return record


def cmd_up(args: argparse.Namespace) -> None:
    state = load_state()
    real = args.real_node or os.environ.get("ELASTICPS_REAL_NODE") == "1"
    if real and not (running(state) and state.get("real_node")):
        missing = realnode.preflight()
        if missing:
            sys.exit("--real-node: this machine lacks " + "; ".join(missing))
    if running(state):
        if real and not state.get("real_node"):
            add_real_node(state)
        else:
            log(f"already running{' with ' + realnode.NODE_NAME if state.get('real_node') else ''}")
        print(env_lines(state), end="")
        return
    if state:
        log("stale state from an earlier run: stopping leftovers")
        stop(state)
    t_start = time.monotonic()
    names_needed = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    if real:
        names_needed += ["kubelet", "kube-proxy", "coredns", "pause"]
    exe = {n: binary(n) for n in names_needed}
    exe["containerd"] = shutil.which("containerd") or "containerd"
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    logs = STATE_DIR / "logs"
    # A fresh etcd each `up`: tests must not see objects of an earlier run.
    for d in ("etcd", "logs"):
        shutil.rmtree(STATE_DIR / d, ignore_errors=True)
    logs.mkdir()
    pki = STATE_DIR / "pki"
    make_pki(pki)
    token = write_auth(STATE_DIR)
    port_names = ["etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok"]
    if real:
        port_names += REAL_NODE_PORTS
    ports = {k: free_port() for k in port_names}
    kubeconfig = STATE_DIR / "kubeconfig"
    write_kubeconfig(kubeconfig, ports["apiserver"], pki / "ca.crt", token)
    kc = str(kubeconfig)
    api = Api(ports["apiserver"], pki / "ca.crt", token)
    procs: dict[str, subprocess.Popen] = {}
    state = {"bin": str(bin_dir()), "kubeconfig": kc, "ports": ports, "components": {}, "real_node": real}
    record = recorder(state, exe, procs)

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

    record("kube-apiserver", start_apiserver(exe["kube-apiserver"], etcd_url, ports["apiserver"], pki, logs, real))
    t = wait_for("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, 120,
                 procs["kube-apiserver"], logs / "kube-apiserver.log")
    t_api = time.monotonic() - t_start
    log(f"kube-apiserver ready after {t:.1f}s ({t_api:.1f}s since up)")

    rates = [f"--kube-api-qps={args.kube_api_qps:g}", f"--kube-api-burst={args.kube_api_burst}"] \
        if args.kube_api_qps else []
    record("kube-controller-manager", start("kube-controller-manager", [
        exe["kube-controller-manager"], f"--kubeconfig={kc}", *rates,
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kcm']}",
        # One instance only: leader election would just add a lease wait.
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
    ], logs))
    record("kube-scheduler", start("kube-scheduler", [
        exe["kube-scheduler"], f"--kubeconfig={kc}", *rates,
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['scheduler']}", "--leader-elect=false",
    ], logs))
    kwok_config = []
    if args.kwok_parallelism:
        # kwok moves pods through their stages (bound -> Running, deleted -> gone) 4 at a time by
        # default: a 1,024-pod job would measure kwok. Its stages stay the built-in defaults.
        path = STATE_DIR / "kwok.yaml"
        path.write_text(json.dumps({
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"podPlayStageParallelism": args.kwok_parallelism,
                        "nodePlayStageParallelism": args.kwok_parallelism},
        }) + "\n")
        kwok_config = [f"--config={path}"]
    record("kwok", start("kwok", [
        exe["kwok"], f"--kubeconfig={kc}", *kwok_config,
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

    cpu_nodes = args.cpu_nodes if args.cpu_nodes is not None else int(os.environ.get("CPU_NODES", "3"))
    gpu_nodes = int(os.environ.get("GPU_NODES", "1"))
    gpus = int(os.environ.get("GPUS_PER_NODE", "2"))
    names = []
    for i in range(cpu_nodes):
        names.append(f"kwok-cpu-{i}")
        manifest = node_manifest(names[-1], "8", "32Gi", 0, args.pods_per_node)
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
    if real:
        start_real_node(state, exe, ports, api, pki, logs, record, procs, t_start)
    if args.kueue:
        start_kueue(state, api, pki, logs, procs)
    if args.coscheduler:
        start_coscheduler(state, pki, logs, procs)
    t_total = time.monotonic() - t_start
    state.setdefault("timings", {})
    state["timings"].update({"apiserver_ready_s": round(t_api, 2), "cluster_ready_s": round(t_total, 2)})
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    log(f"{len(names)} fake nodes Ready{' + ' + realnode.NODE_NAME if real else ''}; cluster ready {t_total:.1f}s after up "
        f"(apiserver {t_api:.1f}s); logs in {logs}")
    print(env_lines(state), end="")


def add_real_node(state: dict) -> None:
    """The real node joins a running cluster that has none (``up`` then ``up --real-node``). Only
    the apiserver starts again, listening where the node's pods reach it; etcd and every object in
    it, the fake nodes and whatever was installed stay."""
    t_start = time.monotonic()
    log(f"adding {realnode.NODE_NAME} to the running cluster: the apiserver restarts on the node's bridge "
        f"address; objects, fake nodes and installs stay")
    exe = {n: binary(n) for n in ("kube-apiserver", "kubelet", "kube-proxy", "coredns", "pause")}
    exe["containerd"] = shutil.which("containerd") or "containerd"
    ports = state["ports"]
    for name in REAL_NODE_PORTS:
        ports[name] = free_port()
    pki, logs = STATE_DIR / "pki", STATE_DIR / "logs"
    api = Api(ports["apiserver"], pki / "ca.crt", (STATE_DIR / "admin.token").read_text().strip())
    terminate("kube-apiserver", state["components"]["kube-apiserver"])
    procs: dict[str, subprocess.Popen] = {}
    record = recorder(state, exe, procs)
    state["real_node"] = True
    record("kube-apiserver", start_apiserver(exe["kube-apiserver"], f"http://127.0.0.1:{ports['etcd']}",
                                             ports["apiserver"], pki, logs, real=True))
    wait_for("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, 120,
             procs["kube-apiserver"], logs / "kube-apiserver.log")
    start_real_node(state, exe, ports, api, pki, logs, record, procs, t_start)
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def versions(*names: str) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f'source "{HERE}/versions.sh" && ' + " && ".join(f'echo "${n}"' for n in names)],
        check=True, capture_output=True, text=True,
    )
    return dict(zip(names, out.stdout.split()))


COREDNS_RBAC = [
    ("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "system:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    }),
    ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
    }),
]


def start_real_node(state: dict, exe: dict[str, str], ports: dict[str, int], api: Api, pki: Path,
                    logs: Path, record, procs: dict[str, subprocess.Popen], t_start: float) -> None:
    """containerd, CoreDNS, kube-proxy and kubelet of the real node (realnode.py), until it is Ready."""
    t0 = time.monotonic()
    pause_version = versions("PAUSE_VERSION")["PAUSE_VERSION"]
    kubeconfigs = {}
    for name in SYSTEM_USERS:
        kubeconfigs[name] = STATE_DIR / f"{name}.kubeconfig"
        write_kubeconfig(kubeconfigs[name], ports["apiserver"], pki / "ca.crt", system_token(STATE_DIR, name))
    # Nothing of an earlier run's node survives (IP allocations, kubelet state); the image cache
    # lives elsewhere (realnode.CONTAINERD_ROOT).
    realnode.unmount_under(STATE_DIR / "node")
    shutil.rmtree(STATE_DIR / "node", ignore_errors=True)
    paths = realnode.write_configs(STATE_DIR, ports, kubeconfigs, pki / "ca.crt", pause_version)
    sock = paths["containerd_sock"]
    state["containerd_sock"] = str(sock)
    for url, body in COREDNS_RBAC:
        code, out = api.call("POST", url, body)
        if code not in (201, 409):
            sys.exit(f"creating {body['metadata']['name']}: {code} {out}")
    record("containerd", start("containerd", [exe["containerd"], "--config", str(paths["containerd_conf"])], logs))
    wait_for("containerd", lambda: realnode.ctr(sock, "version", check=False).returncode == 0, 30,
             procs["containerd"], logs / "containerd.log")
    realnode.ensure_pause(sock, Path(exe["pause"]), pause_version)
    stale = realnode.remove_unnamed_images(sock)  # what earlier loads left (before they removed it)
    if stale:
        log(f"removed {len(stale)} image(s) no name points at from the node's containerd")
    log(f"containerd up, {realnode.pause_image(pause_version)} present ({time.monotonic() - t0:.1f}s)")
    record("coredns", start("coredns", [exe["coredns"], "-conf", str(paths["corefile"])], logs))
    record("kube-proxy", start("kube-proxy", [exe["kube-proxy"], f"--config={paths['kube_proxy_conf']}", "--v=1"], logs))
    node = STATE_DIR / "node"
    record("kubelet", start("kubelet", [
        exe["kubelet"], f"--config={paths['kubelet_conf']}", f"--kubeconfig={kubeconfigs['kubelet']}",
        f"--root-dir={node / 'kubelet'}", f"--cert-dir={node / 'kubelet-pki'}",
        f"--hostname-override={realnode.NODE_NAME}", f"--node-ip={realnode.NODE_IP}",
        f"--node-labels={realnode.LABEL}=true", "--v=1",
    ], logs))
    t = wait_for(f"node {realnode.NODE_NAME} Ready", lambda: realnode.node_ready(api.call), 120,
                 procs["kubelet"], logs / "kubelet.log")
    log(f"{realnode.NODE_NAME} Ready after {t:.1f}s")
    wait_for("coredns", lambda: http_ok(f"http://127.0.0.1:{ports['coredns-ready']}/ready"), 60,
             procs["coredns"], logs / "coredns.log")
    wait_for("kube-proxy", lambda: http_ok(f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz"), 60,
             procs["kube-proxy"], logs / "kube-proxy.log")
    state.setdefault("timings", {})["real_node_ready_s"] = round(time.monotonic() - t0, 2)
    log(f"real node {realnode.NODE_NAME}: containerd, kubelet, kube-proxy, CoreDNS ready in "
        f"{time.monotonic() - t0:.1f}s ({time.monotonic() - t_start:.1f}s since up)")


def start_kueue(state: dict, api: Api, pki: Path, logs: Path, procs: dict[str, subprocess.Popen]) -> None:
    """Kueue's CRDs, its controller manager and its webhooks (kueue.py), until it is ready."""
    t0 = time.monotonic()
    version = versions("KUEUE_VERSION")["KUEUE_VERSION"]
    exe = {"kueue": binary("kueue")}
    kubectl, kc = binary("kubectl"), state["kubeconfig"]
    module = kueue.module_dir("sigs.k8s.io/kueue", version)
    ports = state["ports"]
    for name in ("kueue-webhook", "kueue-health"):
        ports[name] = free_port()
    url = f"https://127.0.0.1:{ports['kueue-webhook']}"
    ca = (pki / "ca.crt").read_bytes()
    cert_dir = STATE_DIR / "kueue"
    kueue.serving_cert(pki, cert_dir, run)
    try:
        kueue.metrics_cert(run)
    except RuntimeError as err:
        sys.exit(str(err))
    code, out = api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": kueue.NAMESPACE}})
    if code not in (201, 409):
        sys.exit(f"creating namespace {kueue.NAMESPACE}: {code} {out}")
    apply(kubectl, kc, kueue.crds(kubectl, kc, module, url, ca))
    wait_for("Kueue's CRDs Established", lambda: not unestablished(api, kueue.CONVERTED, kueue.GROUP), 120,
             on_timeout=lambda: f"not Established: {unestablished(api, kueue.CONVERTED, kueue.GROUP)}")
    config = cert_dir / "config.yaml"
    config.write_text(json.dumps(kueue.configuration(ports["kueue-health"], ports["kueue-webhook"], cert_dir), indent=2))
    record = recorder(state, exe, procs)
    record("kueue", start("kueue", [exe["kueue"], f"--config={config}", f"--kubeconfig={kc}",
                                    "--feature-gates=VisibilityOnDemand=false"], logs))
    t = wait_for("kueue /readyz", lambda: http_ok(f"http://127.0.0.1:{ports['kueue-health']}/readyz"), 120,
                 procs["kueue"], logs / "kueue.log")
    apply(kubectl, kc, kueue.webhook_configurations(kubectl, kc, module, url, ca))
    state["kueue"] = version
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    log(f"kueue {version} ready after {t:.1f}s, webhooks on {url} ({time.monotonic() - t0:.1f}s in all)")


def start_coscheduler(state: dict, pki: Path, logs: Path, procs: dict[str, subprocess.Popen]) -> None:
    """The PodGroup CRD and a second kube-scheduler running the Coscheduling plugin (kueue.py)."""
    t0 = time.monotonic()
    version = versions("SCHED_PLUGINS_VERSION")["SCHED_PLUGINS_VERSION"]
    exe = {"coscheduler": binary("coscheduler"), "coscheduler-controller": binary("coscheduler-controller")}
    kubectl, kc = binary("kubectl"), state["kubeconfig"]
    module = kueue.module_dir("sigs.k8s.io/scheduler-plugins", version)
    crds = kueue.as_json(kubectl, kc, module / "manifests" / "coscheduling" / "crd.yaml")
    apply(kubectl, kc, crds)
    ports = state["ports"]
    ports["coscheduler"] = free_port()
    config = STATE_DIR / "coscheduler.yaml"
    config.write_text(json.dumps(kueue.coscheduler_configuration(kc), indent=2))
    record = recorder(state, exe, procs)
    record("coscheduler", start("coscheduler", [
        exe["coscheduler"], f"--config={config}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['coscheduler']}",
    ], logs))
    t = wait_for("coscheduler /healthz", lambda: http_ok(f"https://127.0.0.1:{ports['coscheduler']}/healthz", insecure=True),
                 120, procs["coscheduler"], logs / "coscheduler.log")
    # Its controller keeps the PodGroups' status; each update sends a waiting gang back to the queue.
    ports["coscheduler-controller"], probe = free_port(), free_port()
    record("coscheduler-controller", start("coscheduler-controller", [
        exe["coscheduler-controller"], f"--kubeconfig={kc}", f"--metricsAddr=127.0.0.1:{ports['coscheduler-controller']}",
        f"--probeAddr=127.0.0.1:{probe}",
    ], logs))
    wait_for("coscheduler-controller /readyz", lambda: http_ok(f"http://127.0.0.1:{probe}/readyz"), 60,
             procs["coscheduler-controller"], logs / "coscheduler-controller.log")
    state["coscheduler"] = version
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    log(f"coscheduler (scheduler-plugins {version}, scheduler {kueue.COSCHEDULER_NAME}) ready after {t:.1f}s "
        f"({time.monotonic() - t0:.1f}s in all)")


def cmd_coscheduler(args: argparse.Namespace) -> None:
    """The gang scheduler joins a running cluster (``up`` then ``coscheduler``)."""
    state = load_state()
    if not running(state):
        sys.exit("cluster is not running: hack/cluster/cluster.py up")
    if state.get("coscheduler"):
        log(f"coscheduler {state['coscheduler']} already running")
        return
    start_coscheduler(state, STATE_DIR / "pki", STATE_DIR / "logs", {})


def apply(kubectl: str, kubeconfig: str, objects: list[dict]) -> None:
    """Server-side apply (CRDs are too large for the client-side annotation)."""
    doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts",
                          "--field-manager=elasticps-cluster", "-f", "-"], input=doc, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kubectl apply: {out.stderr.strip()[-2000:]}")


def cmd_kueue(args: argparse.Namespace) -> None:
    """Kueue joins a running cluster (``up`` then ``kueue``): nothing else restarts."""
    state = load_state()
    if not running(state):
        sys.exit("cluster is not running: hack/cluster/cluster.py up")
    if state.get("kueue"):
        log(f"kueue {state['kueue']} already running")
        return
    api = admin_api(state)
    if api is None:
        sys.exit(f"no admin token in {STATE_DIR}: hack/cluster/cluster.py down, then up")
    start_kueue(state, api, STATE_DIR / "pki", STATE_DIR / "logs", {})


def admin_api(state: dict) -> Api | None:
    try:
        token = (STATE_DIR / "admin.token").read_text().strip()
    except OSError:
        return None
    return Api(state["ports"]["apiserver"], STATE_DIR / "pki" / "ca.crt", token)


def drain_real_node(state: dict) -> None:
    """Cordon the real node and delete its pods while the kubelet runs, so that containers stop
    through SIGTERM and pod sandboxes (network namespaces, veths, IPs) are torn down by the CRI."""
    api = admin_api(state)
    if api is None:
        return
    node = realnode.NODE_NAME
    try:
        req_ok = _patch_unschedulable(api, node)
        code, body = api.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        pods = body.get("items", []) if code == 200 and isinstance(body, dict) else []
        for pod in pods:
            md = pod["metadata"]
            api.call("DELETE", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}")
        deadline = time.monotonic() + 60
        while pods and time.monotonic() < deadline:
            code, body = api.call("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
            if code != 200 or not body.get("items"):
                break
            time.sleep(0.5)
        if pods:
            log(f"drained {len(pods)} pod(s) from {node}" + ("" if req_ok else " (cordon failed)"))
    except (OSError, urllib.error.URLError, ssl.SSLError) as err:
        log(f"draining {node}: {err}")


def _patch_unschedulable(api: Api, node: str) -> bool:
    data = json.dumps({"spec": {"unschedulable": True}}).encode()
    req = urllib.request.Request(f"{api.base}/api/v1/nodes/{node}", data=data, method="PATCH")
    req.add_header("Authorization", f"Bearer {api.token}")
    req.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(req, context=api.ctx, timeout=5) as r:
            return r.status == 200
    except urllib.error.HTTPError:
        return False


def terminate(name: str, c: dict) -> None:
    """SIGTERM, then SIGKILL after 15 s, to a component of ours (``c``: its pid and executable)."""
    os.kill(c["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 15
    while alive(c["pid"], c["exe"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(c["pid"], c["exe"]):
        log(f"{name} ignored SIGTERM; killing")
        os.kill(c["pid"], signal.SIGKILL)
        wait_for(f"{name} to be killed", lambda: not alive(c["pid"], c["exe"]), 10)
    log(f"stopped {name} (pid {c['pid']})")


def stop(state: dict) -> None:
    real = state.get("real_node")
    sock = Path(state.get("containerd_sock", STATE_DIR / "node" / "containerd.sock"))
    comps = state.get("components", {})
    if real and comps.get("kubelet") and alive(comps["kubelet"]["pid"], comps["kubelet"]["exe"]):
        drain_real_node(state)
    for name in reversed(COMPONENTS):
        c = comps.get(name)
        if name == "containerd" and real:
            # The kubelet is gone: whatever still runs (a pod the drain missed) goes now.
            realnode.cleanup_runtime(sock, log)
        if not c or not alive(c["pid"], c["exe"]):
            continue
        terminate(name, c)
        if name == "containerd":
            realnode.kill_shims(sock, log)
    if real:
        realnode.unmount_under(STATE_DIR / "node")
        realnode.cleanup_network()
        kube_proxy = shutil.which("kube-proxy", path=state.get("bin")) or ""
        if kube_proxy:
            realnode.kube_proxy_cleanup(kube_proxy)
    (STATE_DIR / "state.json").unlink(missing_ok=True)


def cmd_down(args: argparse.Namespace) -> None:
    state = load_state()
    if state:
        stop(state)
    else:
        log("nothing running")
    if args.purge:
        # Never delete through a mount point the kubelet left (hostPath subPaths are bind mounts).
        realnode.unmount_under(STATE_DIR)
        if realnode.mounts_under(STATE_DIR):
            sys.exit(f"{STATE_DIR}: mounts remain ({realnode.mounts_under(STATE_DIR)[:3]}); not deleting")
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        log(f"removed {STATE_DIR}")
        if realnode.running_kubelet():
            log(f"another cluster's {realnode.NODE_NAME} runs: its bridge and iptables chains stay")
            return
        left = realnode.host_teardown()
        if left:
            sys.exit(f"the host keeps {'; '.join(left)} (root removes them; `iptables -S` lists them)")
        log(f"host clean: no bridge {realnode.BRIDGE}, no KUBE-/CNI- iptables chains")


def cmd_load_image(args: argparse.Namespace) -> None:
    state = load_state()
    if not running(state) or not state.get("real_node"):
        sys.exit("no real node running: hack/cluster/cluster.py up --real-node")
    docker_env = dict(os.environ)
    engine = subprocess.run(["bash", str(HERE.parent / "image" / "engine.sh"), "start"], capture_output=True, text=True)
    for line in engine.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key == "DOCKER_HOST":
            docker_env["DOCKER_HOST"] = value
    timings = {}
    for ref in args.refs:
        timings[ref] = round(realnode.import_image(Path(state["containerd_sock"]), ref, log, docker_env), 2)
    print(json.dumps(timings))


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
    for name in [n for n in COMPONENTS if n in state["components"] or n in COMPONENTS[:5]]:
        c = state["components"].get(name)
        up = bool(c) and alive(c["pid"], c["exe"])
        ok &= up
        print(f"{name:25} {'running' if up else 'DOWN'}  pid {c['pid'] if c else '-'}")
    print(f"kubeconfig {state['kubeconfig']}; ports {state['ports']}")
    sys.exit(0 if ok else 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("--real-node", action="store_true",
                   help="also one real node (containerd, kubelet, kube-proxy, CoreDNS); needs root")
    u.add_argument("--cpu-nodes", type=int, default=None, help="fake CPU nodes (default: $CPU_NODES or 3)")
    u.add_argument("--pods-per-node", type=int, default=110, help="pod capacity of each fake CPU node (default: 110)")
    u.add_argument("--kube-api-qps", type=float, default=0,
                   help="client QPS of kube-scheduler and kube-controller-manager (default: theirs, 50 and 20)")
    u.add_argument("--kube-api-burst", type=int, default=0, help="their client burst, with --kube-api-qps")
    u.add_argument("--kwok-parallelism", type=int, default=0,
                   help="pods (and nodes) kwok moves through their stages at once (default: kwok's, 4)")
    u.add_argument("--kueue", action="store_true",
                   help="also Kueue (its CRDs, webhooks and controller manager; built by build.sh)")
    u.add_argument("--coscheduler", action="store_true",
                   help="also a gang scheduler: scheduler-plugins' kube-scheduler with Coscheduling (built by build.sh)")
    u.set_defaults(fn=cmd_up)
    sub.add_parser("kueue", help="add Kueue to the running cluster").set_defaults(fn=cmd_kueue)
    sub.add_parser("coscheduler", help="add the gang scheduler (Coscheduling) to the running cluster").set_defaults(
        fn=cmd_coscheduler)
    li = sub.add_parser("load-image", help="docker save REF | ctr import into the real node's containerd")
    li.add_argument("refs", nargs="+")
    li.set_defaults(fn=cmd_load_image)
    d = sub.add_parser("down")
    d.add_argument("--purge", action="store_true",
                   help="also delete the state dir (keys, token, logs) and what a real node left on the host "
                        "(its bridge, its iptables chains)")
    d.set_defaults(fn=cmd_down)
    sub.add_parser("env").set_defaults(fn=cmd_env)
    sub.add_parser("status").set_defaults(fn=cmd_status)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
