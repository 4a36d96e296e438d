"""One real node beside the kwok nodes: containerd + runc, CNI bridge, kubelet, kube-proxy, CoreDNS.

Used by ``cluster.py up --real-node``; everything runs as host processes of this machine (root needed):

* containerd 1.6 and runc from Debian, with a socket, config and state of the cluster's own (it never
  touches /run/containerd, so a Docker engine on the same machine keeps its own containerd). Its root
  (content store and snapshots) is a cache outside the repo, so an image imported once stays (until
  a newer build of it replaces it).
* CNI: Debian's bridge + host-local + portmap + loopback plugins. The bridge ``elasticps0`` is created
  here with the gateway address NODE_IP: pods reach the host through it, and the apiserver, CoreDNS and
  the kubelet are advertised on it (Node InternalIP), so nothing listens on the machine's own network.
* kubelet (same release as the control plane), cgroupfs driver, registered with the label
  ``elasticps.io/real-node=true`` and the taint ``elasticps.io/real-node=true:NoSchedule``: only pods
  that tolerate it and select it run here; kwok never manages the node (it has no kwok annotation).
* kube-proxy (iptables mode) so that ClusterIPs work: pods reach the apiserver through the
  ``kubernetes`` Service as in any cluster (the operator's in-cluster config uses it).
* CoreDNS as a host process serving ``cluster.local`` from the apiserver on NODE_IP:53; the kubelet's
  clusterDNS points pods at it, so ``{job}-ps-{i}.{namespace}.svc`` resolves.

Only one real node per machine (one bridge, one pod subnet, port 53 on NODE_IP). Stdlib only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

NODE_NAME = "real-node-0"
LABEL = "elasticps.io/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
BRIDGE = "elasticps0"
POD_SUBNET = "10.245.0.0/24"
NODE_IP = "10.245.0.1"  # the bridge's (gateway) address
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CNI_BIN = "/usr/lib/cni"
CACHE = Path(os.environ.get("ELASTICPS_CACHE") or Path.home() / ".cache" / "elasticps")
# The content store and snapshots: cached across clusters (an imported image survives `down`).
CONTAINERD_ROOT = Path(os.environ.get("ELASTICPS_CONTAINERD_ROOT") or CACHE / "node-containerd")
NAMESPACE = "k8s.io"  # containerd namespace of the CRI plugin


def pause_image(version: str) -> str:
    return f"registry.k8s.io/pause:{version}"


def preflight() -> list[str]:
    """What this machine lacks for a real node (empty: nothing)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (kubelet, containerd and CNI need it)")
    for tool in ("containerd", "runc", "ctr", "iptables", "ip"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt-get install containerd runc iptables iproute2)")
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        if not os.access(f"{CNI_BIN}/{plugin}", os.X_OK):
            missing.append(f"{CNI_BIN}/{plugin} (apt-get install containernetworking-plugins)")
    other = running_kubelet()
    if other:
        missing.append(f"a free slot: the kubelet of another real node runs already (pid {other}); one per machine")
    return missing


def running_kubelet() -> int | None:
    """The pid of a kubelet of ours (any cluster dir) running on this machine, if any."""
    needle = f"--hostname-override={NODE_NAME}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"kubelet") and needle in argv:
                return int(proc.name)
    return None


def sh(*cmd: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(cmd, input=input, capture_output=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    return done


def host_setup() -> None:
    """Kernel settings and the bridge. Settings a node needs; each is idempotent."""
    if shutil.which("modprobe"):  # the modules are often built in (no modprobe at all)
        sh("modprobe", "br_netfilter", check=False)
        sh("modprobe", "overlay", check=False)
    for key, value in (("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")):
        path = Path("/proc/sys") / key
        if path.exists() and path.read_text().strip() != value:
            path.write_text(value)
    if sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    addrs = sh("ip", "-4", "-o", "addr", "show", "dev", BRIDGE).stdout.decode()
    if f" {NODE_IP}/" not in addrs:
        sh("ip", "addr", "add", f"{NODE_IP}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")


CAP_SYS_RESOURCE = 24


def has_capability(bit: int) -> bool:
    """Whether this process holds a capability. Some sandboxes (these machines' VMs among them)
    withhold CAP_SYS_RESOURCE even from root: then nobody may lower oom_score_adj, and runc fails
    every pod sandbox (-998) with "can't get final child's PID from pipe: EOF". containerd's
    restrict_oom_score_adj clamps the scores to its own instead (as for rootless containerd)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def write_configs(state: Path, ports: dict[str, int], kubeconfigs: dict[str, Path], ca: Path,
                  pause_version: str) -> dict[str, Path]:
    """containerd, CNI, kubelet, kube-proxy and CoreDNS configuration under state/node."""
    node = state / "node"
    (node / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
    paths = {
        "containerd_sock": node / "containerd.sock",
        "containerd_conf": node / "containerd.toml",
        "kubelet_conf": node / "kubelet.yaml",
        "kube_proxy_conf": node / "kube-proxy.yaml",
        "corefile": node / "Corefile",
        "resolv_conf": node / "resolv.conf",
    }
    sock = paths["containerd_sock"]
    # containerd 1.6 (config version 2). Its own sockets and state dir: the Docker engine's
    # containerd (if any) lives at other paths. cgroupfs: no systemd is PID 1 on these machines.
    paths["containerd_conf"].write_text(f"""version = 2
root = "{CONTAINERD_ROOT / 'root'}"
state = "{node / 'containerd-state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{CONTAINERD_ROOT / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image(pause_version)}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  restrict_oom_score_adj = {str(not has_capability(CAP_SYS_RESOURCE)).lower()}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{node / 'cni' / 'net.d'}"
    max_conf_num = 1
""")
    # The bridge exists already (host_setup) with NODE_IP; the plugin adds the veths to it.
    conflist = {
        "cniVersion": "1.0.0",
        "name": "elasticps-node",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "dataDir": str(node / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (node / "cni" / "net.d" / "10-elasticps.conflist").write_text(json.dumps(conflist, indent=2) + "\n")
    # Pods with dnsPolicy Default get this; ClusterFirst pods get clusterDNS plus the search path.
    paths["resolv_conf"].write_text(f"nameserver {NODE_IP}\n")
    # JSON is YAML: the kubelet and kube-proxy read either.
    kubelet = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": ports["kubelet"], "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet-healthz"],
        # The apiserver (logs, exec, port-forward) authenticates with a client cert of our CA;
        # anything else is asked of the apiserver (webhook).
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{sock}",
        "cgroupDriver": "cgroupfs",
        # This host boots cgroups in hybrid (v1) mode: kubelet 1.34 only warns; say so explicitly
        # (1.35 refuses v1 unless this is false).
        "failCgroupV1": False,
        "clusterDNS": [NODE_IP], "clusterDomain": "cluster.local",
        "resolvConf": str(paths["resolv_conf"]),
        "failSwapOn": False,
        "registerWithTaints": [TAINT],
        "serializeImagePulls": False,
        "maxPods": 60,
        # A test machine's disk: never evict for it ("0%" turns a signal off) and never collect
        # images (100 turns image GC off). Under disk pressure the kubelet deletes every image no
        # container uses, whatever the GC thresholds, and containerd 1.6 does not tell it the pause
        # image is pinned: CI's machine, its disk filled, lost the pause image twice between two
        # tests, and every later pod stayed in ContainerCreating ("failed to pull ... pause").
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "0%", "imagefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
        # The CRI calls' deadline (default 2m): creating the first container of a 5.5 GB image (the
        # torch one) on a busy disk can take longer, and a call abandoned at 2m is asked again while
        # containerd still works on the first ("name is reserved"), for as long as the disk is slow.
        "runtimeRequestTimeout": "10m",
        "kubeAPIQPS": 50, "kubeAPIBurst": 100,
        "syncFrequency": "10s", "fileCheckFrequency": "10s",
    }
    paths["kubelet_conf"].write_text(json.dumps(kubelet, indent=2) + "\n")
    proxy = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfigs["kube-proxy"])},
        "mode": "iptables", "clusterCIDR": POD_SUBNET, "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        # Leave the machine's conntrack table size alone.
        "conntrack": {"maxPerCore": 0, "min": 0},
    }
    paths["kube_proxy_conf"].write_text(json.dumps(proxy, indent=2) + "\n")
    paths["corefile"].write_text(f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{ports['coredns-health']}
    ready 127.0.0.1:{ports['coredns-ready']}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfigs['coredns']} elasticps
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
""")
    return paths


def ctr(sock: Path, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return sh("ctr", "--address", str(sock), "--namespace", NAMESPACE, *args, input=input, check=check)


def has_image(sock: Path, ref: str) -> bool:
    out = ctr(sock, "images", "ls", "-q", check=False).stdout.decode().split()
    return ref in out


def holds_image(sock: Path, name: str, config_digest: str) -> bool:
    """containerd has the name and the image's config (a Docker image ID is its config's digest)."""
    blobs = ctr(sock, "content", "ls", "-q", check=False).stdout.decode().split()
    return has_image(sock, name) and config_digest in blobs


def pause_archive(pause_binary: Path, ref: str) -> bytes:
    """A `docker save` style archive of the pause image: one layer holding /pause, run as 65535
    as upstream's image does. Built here from the binary build.sh compiled, so no registry is needed."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo("pause")
        data = pause_binary.read_bytes()
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        t.addfile(info, io.BytesIO(data))
    layer = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "elasticps hack/cluster (pause.c from k8s.io/kubernetes)"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, blob in ((config_name, config), (layer_name, layer), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(blob), 0o644, 0
            t.addfile(info, io.BytesIO(blob))
    return out.getvalue()


def ensure_pause(sock: Path, pause_binary: Path, version: str) -> None:
    ref = pause_image(version)
    if not has_image(sock, ref):
        ctr(sock, "images", "import", "--no-unpack=false", "-", input=pause_archive(pause_binary, ref))
        # Without this label the kubelet's image GC may remove the sandbox image (containerd's CRI
        # sets it for the configured sandbox image itself once it sees the image; be explicit).
    ctr(sock, "images", "label", ref, "io.cri-containerd.pinned=pinned", check=False)


def import_image(sock: Path, ref: str, log: Callable[[str], None], docker_env: dict[str, str] | None = None) -> float:
    """`docker save REF | ctr images import -` unless containerd has that very image already.

    The Docker image ID (sha256 of its config) is what containerd stores as the image's config
    digest, so the comparison needs no marker file. The archive is streamed, never written to disk.
    When the import replaced an older image of that name, a synchronous garbage collection follows
    (the removal of a scratch tag triggers it): an import only moves the name, and the old image's
    layers stayed behind; with an image rebuilt for every commit that filled this machine's disk
    (28 GiB of dead torch and base layers). Layers both builds share are kept, never imported twice.
    Returns the seconds spent (0 when already there).
    """
    env = docker_env or dict(os.environ)
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], env=env,
                              capture_output=True, text=True)
    if image_id.returncode != 0:
        raise RuntimeError(f"docker has no image {ref} (make image): {image_id.stderr.strip()}")
    wanted = image_id.stdout.strip()
    t0 = time.monotonic()
    name = f"docker.io/library/{ref}"
    if holds_image(sock, name, wanted):
        log(f"image {ref} ({wanted[:19]}) already in the node's containerd")
        return 0.0
    had_name = has_image(sock, name)
    stream_import(sock, ["docker", "save", ref], name, wanted, env)
    if had_name:
        scratch = f"{name}-collect-garbage"
        ctr(sock, "images", "tag", "--force", name, scratch)
        ctr(sock, "images", "rm", "--sync", scratch)
    stale = remove_unnamed_images(sock)
    seconds = time.monotonic() - t0
    log(f"image {ref}: docker save | ctr import {seconds:.1f}s"
        + (f"; {len(stale)} image(s) no name points at removed" if stale else ""))
    return seconds


def stream_import(sock: Path, producer: list[str], name: str, config_digest: str,
                  env: dict[str, str] | None = None) -> None:
    """`PRODUCER | ctr images import -`, judged by the import: ctr stops reading at the archive's
    end marker, so a producer still writing after it (docker save's last bytes, when ctr was
    quicker) dies of SIGPIPE although everything was imported; CI's torch load failed so once.
    A SIGPIPE is accepted only when ctr succeeded and containerd holds the name and the image's
    config; any other failure raises with what ctr and the producer said."""
    save = subprocess.Popen(producer, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert save.stdout is not None and save.stderr is not None
    imported = subprocess.run(["ctr", "--address", str(sock), "--namespace", NAMESPACE, "images", "import", "-"],
                              stdin=save.stdout, capture_output=True)
    save.stdout.close()
    saved_err = save.stderr.read().decode(errors="replace")
    save.wait()
    said = (f"{producer[0]} {producer[1]}: exit {save.returncode}: {saved_err[-1000:].strip()}; "
            f"ctr images import: exit {imported.returncode}: {imported.stderr.decode(errors='replace')[-1000:].strip()}")
    if imported.returncode != 0:
        raise RuntimeError(f"importing {name} failed: {said}")
    if save.returncode == 0:
        return
    if save.returncode != -signal.SIGPIPE or not holds_image(sock, name, config_digest):
        raise RuntimeError(f"importing {name} failed: {said}")


def remove_unnamed_images(sock: Path) -> list[str]:
    """Removes the images no name points at (``stale_image_ids``), their content and snapshots with
    them (``--sync``: garbage collected before it returns). Returns their references."""
    stale = stale_image_ids(ctr(sock, "images", "ls", check=False).stdout.decode())
    for image_id in stale:
        ctr(sock, "images", "rm", "--sync", image_id, check=False)
    return stale


def stale_image_ids(listing: str) -> list[str]:
    """The references ``sha256:<image id>`` of images no name points at any more, from ``ctr images
    ls``. containerd's CRI plugin keeps such a reference to every image it has seen, so moving a
    name to a new import leaves the old image whole (a torch image and its layers a commit on a
    machine that runs CI again and again, until the disk filled and the kubelet, under disk
    pressure, deleted the unused pause image with the rest). Pure."""
    rows = [line.split() for line in listing.splitlines()[1:] if len(line.split()) >= 3]
    named = {row[2] for row in rows if not row[0].startswith("sha256:")}
    return [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below path, deepest first (so unmounting in order works)."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(path: Path) -> None:
    """The kubelet leaves tmpfs (projected tokens), bind mounts (hostPath subPaths) and the pods'
    rootfs overlays mounted when it stops. They must go before anything under path is deleted,
    or a recursive delete would reach through a bind mount into the host's own files."""
    for point in mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True)


def cleanup_runtime(sock: Path, log: Callable[[str], None]) -> None:
    """After the kubelet stopped: kill what still runs in the CRI namespace, then remove it."""
    if not sock.exists():
        return
    tasks = ctr(sock, "tasks", "ls", "-q", check=False).stdout.decode().split()
    for task in tasks:
        ctr(sock, "tasks", "kill", "-s", "SIGKILL", task, check=False)
    deadline = time.monotonic() + 10
    for task in tasks:
        while ctr(sock, "tasks", "delete", task, check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    containers = ctr(sock, "containers", "ls", "-q", check=False).stdout.decode().split()
    for c in containers:
        ctr(sock, "containers", "rm", c, check=False)
    if tasks or containers:
        log(f"removed {len(tasks)} leftover task(s), {len(containers)} container(s) from containerd")


def cleanup_network() -> None:
    """Pod network namespaces the CRI left behind (pods not torn down through the kubelet)."""
    for ns in Path("/var/run/netns").glob("cni-*") if Path("/var/run/netns").exists() else []:
        subprocess.run(["ip", "netns", "delete", ns.name], capture_output=True)


# Chains the node's parts leave in the host's tables: the kubelet's (KUBE-FIREWALL,
# KUBE-KUBELET-CANARY; kube-proxy --cleanup removes kube-proxy's) and the CNI bridge plugin's.
LEFTOVER_CHAIN_PREFIXES = ("KUBE-", "CNI-")


def leftover_rules(table: str, listing: str) -> list[list[str]]:
    """The iptables arguments that take the node's chains out of one table, given its ``-S``
    listing: first every rule that jumps to one of them (from any chain), then each chain flushed
    and deleted. Pure."""
    ours = [line.split()[1] for line in listing.splitlines()
            if line.startswith("-N ") and line.split()[1].startswith(LEFTOVER_CHAIN_PREFIXES)]
    if not ours:
        return []
    commands = []
    for line in listing.splitlines():
        words = shlex.split(line)
        if len(words) < 2 or words[0] != "-A" or words[1] in ours:
            continue  # a rule of one of ours goes with its chain
        if any(w in ("-j", "-g") and nxt in ours for w, nxt in zip(words, words[1:])):
            commands.append(["-t", table, "-D", *words[1:]])
    for chain in ours:
        commands.append(["-t", table, "-F", chain])
    for chain in ours:
        commands.append(["-t", table, "-X", chain])
    return commands


def host_teardown() -> list[str]:
    """What ``host_setup`` and the node's parts leave on the host: the bridge and the iptables chains
    (IPv4 and IPv6). Returns what could not be removed (empty: the host is clean)."""
    left = []
    if shutil.which("ip") and sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        if sh("ip", "link", "delete", BRIDGE, check=False).returncode != 0:
            left.append(f"bridge {BRIDGE}")
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            listing = sh(tool, "-t", table, "-S", check=False)
            if listing.returncode != 0:
                continue
            for args in leftover_rules(table, listing.stdout.decode()):
                sh(tool, "-w", *args, check=False)
            after = sh(tool, "-t", table, "-S", check=False).stdout.decode()
            left += [f"{tool} -t {table} chain {line.split()[1]}" for line in after.splitlines()
                     if line.startswith("-N ") and line.split()[1].startswith(LEFTOVER_CHAIN_PREFIXES)]
    return left


def kube_proxy_cleanup(kube_proxy: str) -> None:
    subprocess.run([kube_proxy, "--cleanup"], capture_output=True)


def node_ready(api_call: Callable[..., tuple[int, Any]]) -> bool:
    code, body = api_call("GET", f"/api/v1/nodes/{NODE_NAME}")
    if code != 200 or not isinstance(body, dict):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in body.get("status", {}).get("conditions", []))


def kill_shims(sock: Path, log: Callable[[str], None]) -> None:
    """containerd-shim-runc-v2 processes of this containerd that outlived it (found by the socket
    address on their command line, signalled by pid)."""
    needle = str(sock).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and needle in argv:
            try:
                os.kill(int(proc.name), 9)
                log(f"killed leftover shim {proc.name}")
            except OSError:
                pass
