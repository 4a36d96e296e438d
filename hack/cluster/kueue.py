"""Kueue in the test cluster: its CRDs and webhooks from its own Go module, its controller manager as a
host process (``cluster.py kueue``, or ``up --kueue``); and a gang scheduler beside the default one,
the scheduler-plugins' kube-scheduler with its Coscheduling plugin (``cluster.py coscheduler``, or
``up --coscheduler``), its PodGroup CRD from the same module.

Everything comes from ``sigs.k8s.io/kueue`` at ``KUEUE_VERSION`` (versions.sh): the binary build.sh
compiled, and the module's ``config/components`` read from the Go module cache, so the CRDs always
match the binary. What a Deployment in ``kueue-system`` would do differently, and why:

* The webhook server listens on 127.0.0.1 with a serving certificate our test CA signs (Kueue's
  internal cert management is off: it wants a Service and a Secret to rotate). The API server (a
  host process too) reaches it by ``url``, not by Service: every webhook configuration and the CRDs'
  conversion webhooks are rewritten so, with our CA as their ``caBundle``.
* Only the webhooks of Kueue's own objects (group kueue.x-k8s.io: ClusterQueue, LocalQueue, Workload,
  ResourceFlavor, Cohort ...) are registered: Kueue never mutates a Pod, Job or anything else of the
  cluster's. Its job integrations are down to ``batch/job`` (an empty list means its defaults), whose
  controller only looks at Jobs that carry a queue label. TrainingJobs are an external framework:
  the elasticps operator creates their Workloads.
* Its metrics are off, but with its internal cert management off Kueue still loads a metrics serving
  certificate from a fixed path, ``/etc/kueue/metrics/certs``: a self-signed pair is written there
  once (root; the real node needs root too).
* One instance, no leader election; the visibility API server (an aggregated API) is off.

Stdlib only; YAML is turned into JSON by ``kubectl create --dry-run=client -o json``.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

GROUP = "kueue.x-k8s.io"
NAMESPACE = "kueue-system"
# TrainingJob as Kueue names a kind in integrations.externalFrameworks (Kind.version.group).
EXTERNAL_FRAMEWORK = "TrainingJob.v1alpha1.elasticps.io"
# The CRDs upstream's kustomization gives a conversion webhook (config/components/crd/kustomization.yaml).
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def module_dir(module: str, version: str) -> Path:
    """A Go module's directory in the module cache (downloaded once; build.sh already did): Kueue's
    ``config/components``, the scheduler-plugins' ``manifests/coscheduling``."""
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                         capture_output=True, text=True, env=_go_env(), cwd="/")
    if out.returncode != 0:
        raise RuntimeError(f"go mod download {module}@{version}: {out.stderr.strip()[-1000:]}")
    return Path(json.loads(out.stdout)["Dir"])


def _go_env() -> dict[str, str]:
    import os

    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}


def as_json(kubectl: str, kubeconfig: str, path: Path) -> list[dict[str, Any]]:
    """The objects of a YAML file, by the cluster's own kubectl (client-side dry run)."""
    out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "create", "--dry-run=client", "-o", "json", "-f", str(path)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl create --dry-run -f {path}: {out.stderr.strip()[-1000:]}")
    # One JSON document per YAML document, one after the other (or a List).
    decoder, text, at, docs = json.JSONDecoder(), out.stdout, 0, []
    while text[at:].strip():
        doc, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        docs += list(doc["items"]) if doc.get("kind") == "List" else [doc]
        at = end
    return docs


def crds(kubectl: str, kubeconfig: str, module: Path, webhook_url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's CRDs, those with a conversion webhook upstream pointed at ``webhook_url``/convert."""
    out = []
    for path in sorted((module / "config" / "components" / "crd" / "bases").glob("*.yaml")):
        for crd in as_json(kubectl, kubeconfig, path):
            if crd["spec"]["names"]["plural"] in CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"{webhook_url}/convert", "caBundle": base64.b64encode(ca_bundle).decode()},
                    "conversionReviewVersions": ["v1"],
                }}
            out.append(crd)
    return out


def webhook_configurations(kubectl: str, kubeconfig: str, module: Path, webhook_url: str,
                           ca_bundle: bytes) -> list[dict[str, Any]]:
    """Upstream's mutating and validating configurations, cut to the webhooks of Kueue's own group
    and pointed at ``webhook_url`` (the path each webhook had on the Service)."""
    out = []
    for config in as_json(kubectl, kubeconfig, module / "config" / "components" / "webhook" / "manifests.yaml"):
        kept = []
        for hook in config.get("webhooks", []):
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if groups != {GROUP}:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{webhook_url}{path}", "caBundle": base64.b64encode(ca_bundle).decode()}
            kept.append(hook)
        if kept:
            kind = config["kind"]
            config["metadata"] = {"name": "kueue-" + ("mutating" if kind.startswith("Mutating") else "validating")}
            config["webhooks"] = kept
            out.append(config)
    return out


def configuration(health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """The controller manager's Configuration (config.kueue.x-k8s.io/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": [EXTERNAL_FRAMEWORK]},
    }


def serving_cert(pki: Path, cert_dir: Path, run: Any) -> None:
    """tls.crt / tls.key for 127.0.0.1, signed by the cluster's CA (``pki/ca.*``), where Kueue's
    webhook server looks for them."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ext = cert_dir / "tls.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n")
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kueue-webhook",
        "-keyout", str(cert_dir / "tls.key"), "-out", str(cert_dir / "tls.csr"))
    run("openssl", "x509", "-req", "-in", str(cert_dir / "tls.csr"), "-CA", str(pki / "ca.crt"),
        "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
        "-extfile", str(ext), "-out", str(cert_dir / "tls.crt"))


METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def metrics_cert(run: Any) -> None:
    """The certificate Kueue insists on loading for its (disabled) metrics server, once per machine."""
    if (METRICS_CERTS / "tls.crt").exists() and (METRICS_CERTS / "tls.key").exists():
        return
    try:
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        raise RuntimeError(f"Kueue loads a certificate from {METRICS_CERTS}, which only root can create: "
                           f"run as root, or create tls.crt and tls.key there") from None
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=kueue-metrics",
        "-keyout", str(METRICS_CERTS / "tls.key"), "-out", str(METRICS_CERTS / "tls.crt"))


# ---- gang scheduling: the scheduler-plugins' Coscheduling plugin -------------------------------------------
COSCHEDULER_NAME = "scheduler-plugins-scheduler"


def coscheduler_configuration(kubeconfig: str) -> dict[str, Any]:
    """A second kube-scheduler, ``scheduler-plugins-scheduler``, whose one profile sorts its queue by
    pod group and permits a group's pods only together (upstream's manifests/coscheduling)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": kubeconfig},
        "profiles": [{
            "schedulerName": COSCHEDULER_NAME,
            "plugins": {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}],
        }],
    }
