"""``make scale``'s pure parts: the floor's pods made from the operator's, and the ratios to the floor."""

from __future__ import annotations

from typing import Any

from bench.operator_scale import bare, ratios


def test_a_bare_pod_keeps_the_operator_s_spec_and_drops_what_the_server_and_admission_added() -> None:
    made = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "scale-worker-0", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                     "labels": {"elasticps.io/job-name": "scale"}, "annotations": {"a": "b"},
                     "ownerReferences": [{"kind": "TrainingJob", "name": "scale"}]},
        "spec": {"nodeName": "kwok-0", "containers": [{"name": "worker", "image": "i", "volumeMounts": [
                     {"name": "identity", "mountPath": "/var/run/elasticps/identity"},
                     {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
                 "volumes": [{"name": "identity", "secret": {"secretName": "scale-identity"}},
                             {"name": "kube-api-access-x1", "projected": {}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    pod = bare(made)
    assert pod["metadata"] == {"name": "scale-worker-0", "labels": {"elasticps.io/job-name": "scale"}, "annotations": {"a": "b"}}
    assert "status" not in pod and "nodeName" not in pod["spec"]
    assert pod["spec"]["volumes"] == [{"name": "identity", "secret": {"secretName": "scale-identity"}}]
    assert [m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]] == ["identity"]


def run(mode: str, workers: int, created: float, running: float) -> dict[str, Any]:
    return {"mode": mode, "workers": workers, "created_s": created, "running_s": running}


def test_ratios_are_medians_over_each_floor_s_median_per_mode_and_size() -> None:
    doc = {
        "floor": [run("floor-kubectl", 256, 1.0, 2.0), run("floor-kubectl", 256, 3.0, 4.0), run("floor-kubectl", 256, 2.0, 3.0),
                  run("floor-client", 256, 1.2, 1.8)],
        "settings": [{"qps": 400, "burst": 800, "runs": [
            run("operator", 256, 2.2, 3.3), run("operator", 256, 2.4, 3.6), run("operator", 256, 9.0, 9.0),
            run("kueue", 256, 3.0, 4.5), run("operator", 1024, 9.0, 9.0),  # no floor at 1,024: no ratio
        ]}],
    }  # fmt: skip
    rows = ratios(doc)
    assert [(r["mode"], r["workers"], r["runs"]) for r in rows] == [("operator", 256, 3), ("kueue", 256, 1)]
    operator, kueue = rows
    assert operator["floor-kubectl"] == {"runs": 3, "created_s": 2.0, "running_s": 3.0, "created_ratio": 1.2, "running_ratio": 1.2}
    assert operator["floor-client"]["created_ratio"] == 2.0 and operator["floor-client"]["running_ratio"] == 2.0
    assert kueue["floor-kubectl"]["created_ratio"] == 1.5 and kueue["floor-kubectl"]["running_ratio"] == 1.5
