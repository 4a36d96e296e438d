#!/usr/bin/env bash
# Proves a cluster from cluster.py behaves like a real one in the ways the
# operator's end-to-end tests rely on. Run after `cluster.py up`:
#   eval "$(python3 hack/cluster/cluster.py env)" && bash hack/cluster/smoke.sh
# Leaves nothing behind (its namespace and CRD are deleted at the end).
set -euo pipefail

NS=elasticps-smoke
fail() { echo "SMOKE FAIL: $*" >&2; exit 1; }
ms() { date +%s%3N; }
# poll SECONDS CMD...: retry CMD every 0.1 s until it succeeds.
poll() {
  local limit=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < limit )) || return 1
    sleep 0.1
  done
}
cleanup() {
  kubectl delete namespace "$NS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete crd widgets.smoke.elasticps.io --ignore-not-found >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== versions"
kubectl version 2>&1 | sed 's/^/  /'

echo "== nodes"
kubectl get nodes -o wide
ready=$(kubectl get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)
gpu=$(kubectl get node kwok-gpu-0 -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')
[[ "$ready" -ge 4 ]] || fail "expected >=4 Ready nodes, got $ready"
[[ "$gpu" == 2 ]] || fail "kwok-gpu-0 should advertise nvidia.com/gpu=2, got '$gpu'"
echo "  $ready nodes Ready; kwok-gpu-0 allocatable nvidia.com/gpu=$gpu"

kubectl create namespace "$NS" >/dev/null
# ServiceAccount admission needs the namespace's default SA (made by kcm).
poll 30 kubectl -n "$NS" get serviceaccount default || fail "no default ServiceAccount"

echo "== pod scheduled by kube-scheduler, Running via kwok"
t0=$(ms)
kubectl -n "$NS" run web --image=example.invalid/web:1 --restart=Never >/dev/null
poll 60 bash -c "[[ \$(kubectl -n $NS get pod web -o jsonpath='{.status.phase}') == Running ]]" ||
  fail "pod web not Running: $(kubectl -n $NS get pod web -o yaml)"
echo "  Running on $(kubectl -n "$NS" get pod web -o jsonpath='{.spec.nodeName}') after $(( $(ms) - t0 )) ms"
kubectl -n "$NS" get events --field-selector involvedObject.name=web -o custom-columns=REASON:.reason,FROM:.reportingComponent,MESSAGE:.message | sed 's/^/  /'

echo "== GPU pod on the GPU node; oversized GPU request stays Pending/Unschedulable"
cat <<EOF | kubectl -n "$NS" apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: gpu-ok}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: example.invalid/train:1, resources: {limits: {nvidia.com/gpu: 2}}}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-too-big}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: example.invalid/train:1, resources: {limits: {nvidia.com/gpu: 8}}}
EOF
poll 60 bash -c "[[ \$(kubectl -n $NS get pod gpu-ok -o jsonpath='{.status.phase}') == Running ]]" || fail "gpu-ok not Running"
echo "  gpu-ok Running on $(kubectl -n "$NS" get pod gpu-ok -o jsonpath='{.spec.nodeName}')"
poll 30 bash -c "[[ \$(kubectl -n $NS get pod gpu-too-big -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}') == Unschedulable ]]" ||
  fail "gpu-too-big not Unschedulable: $(kubectl -n $NS get pod gpu-too-big -o yaml)"
echo "  gpu-too-big: phase=$(kubectl -n "$NS" get pod gpu-too-big -o jsonpath='{.status.phase}')" \
  "reason=$(kubectl -n "$NS" get pod gpu-too-big -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}')"
echo "  message: $(kubectl -n "$NS" get pod gpu-too-big -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"

echo "== CRD with a CEL rule rejects a bad object"
t0=$(ms)
cat <<'EOF' | kubectl apply -f - >/dev/null
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.smoke.elasticps.io}
spec:
  group: smoke.elasticps.io
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              minReplicas: {type: integer}
              maxReplicas: {type: integer}
            x-kubernetes-validations:
            - rule: self.minReplicas <= self.maxReplicas
              message: minReplicas must not exceed maxReplicas
EOF
kubectl wait --for=condition=Established crd/widgets.smoke.elasticps.io --timeout=30s >/dev/null
echo "  CRD Established after $(( $(ms) - t0 )) ms"
good='{"apiVersion":"smoke.elasticps.io/v1","kind":"Widget","metadata":{"name":"good"},"spec":{"minReplicas":1,"maxReplicas":3}}'
bad='{"apiVersion":"smoke.elasticps.io/v1","kind":"Widget","metadata":{"name":"bad"},"spec":{"minReplicas":5,"maxReplicas":3}}'
# Discovery of the new kind can lag Established by a moment.
poll 30 bash -c "echo '$good' | kubectl -n $NS apply -f -" || fail "good Widget rejected"
if out=$(echo "$bad" | kubectl -n "$NS" apply -f - 2>&1); then fail "bad Widget accepted"; fi
echo "  good accepted; bad rejected: $out"
grep -q 'minReplicas must not exceed maxReplicas' <<<"$out" || fail "unexpected rejection text"

echo "== owner-reference garbage collection (kube-controller-manager)"
kubectl -n "$NS" create configmap owner >/dev/null
uid=$(kubectl -n "$NS" get configmap owner -o jsonpath='{.metadata.uid}')
cat <<EOF | kubectl -n "$NS" apply -f - >/dev/null
apiVersion: v1
kind: ConfigMap
metadata:
  name: child
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: owner, uid: "$uid"}]
EOF
t0=$(ms)
kubectl -n "$NS" delete configmap owner >/dev/null
poll 30 bash -c "! kubectl -n $NS get configmap child" || fail "child not garbage-collected"
echo "  child deleted $(( $(ms) - t0 )) ms after its owner"

echo "== deleting the namespace (namespace controller + kwok pod-delete stage)"
t0=$(ms)
kubectl delete namespace "$NS" --timeout=60s >/dev/null
echo "  namespace gone after $(( $(ms) - t0 )) ms"
echo "SMOKE OK"
