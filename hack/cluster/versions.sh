# Sourced by build.sh and cluster.py's callers: one place that pins what the
# local control plane is made of. Every value can be overridden from the
# environment so CI can try another release without editing files.
#
# K8S_VERSION: newest 1.34 patch the Go module proxy served when this was
# written (users run 1.28-1.34; CEL rules in CRDs need >= 1.25).
# ETCD_VERSION: the etcd server release k8s.io/kubernetes v1.34.x pins in its
# own go.mod, i.e. what upstream tests this apiserver against.
# KWOK_VERSION: v0.7.0 is built on client-go 0.33 (within skew of 1.34);
# v0.8.0 needs client-go 0.36 and go 1.26 in go.mod.
# HELM_VERSION: last helm 3.19 patch, built on k8s libraries 0.34.
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
# The real node (cluster.py up --real-node): kubelet and kube-proxy come from K8S_VERSION's module
# set; COREDNS_VERSION and PAUSE_VERSION are what kubeadm v1.34 deploys (its constants.go), the pause
# binary is compiled from the pause.c shipped in the k8s.io/kubernetes module at K8S_VERSION.
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"
PAUSE_VERSION="${PAUSE_VERSION:-3.10.1}"
# Kueue (cluster.py kueue): the newest release the Go module proxy served when it was added; its
# CRDs and webhook configuration come from the same module (config/components), never from a copy.
# Built on client-go 0.35, within skew of a 1.34 apiserver.
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# The coscheduling plugin (gang scheduling by PodGroup) in a second kube-scheduler: scheduler-plugins
# v0.34.7 is built on Kubernetes 1.34.7 (its go.mod), the control plane's minor.
SCHED_PLUGINS_VERSION="${SCHED_PLUGINS_VERSION:-v0.34.7}"

# Everything built lives outside the repository, keyed by version, so that a
# version bump never reuses a stale binary and `git clean` never costs a rebuild.
ELASTICPS_CACHE="${ELASTICPS_CACHE:-$HOME/.cache/elasticps}"
K8S_DIR="$ELASTICPS_CACHE/k8s-$K8S_VERSION"
ETCD_DIR="$ELASTICPS_CACHE/etcd-$ETCD_VERSION"
KWOK_DIR="$ELASTICPS_CACHE/kwok-$KWOK_VERSION"
HELM_DIR="$ELASTICPS_CACHE/helm-$HELM_VERSION"
COREDNS_DIR="$ELASTICPS_CACHE/coredns-$COREDNS_VERSION"
PAUSE_DIR="$ELASTICPS_CACHE/pause-$PAUSE_VERSION"
KUEUE_DIR="$ELASTICPS_CACHE/kueue-$KUEUE_VERSION"
SCHED_PLUGINS_DIR="$ELASTICPS_CACHE/scheduler-plugins-$SCHED_PLUGINS_VERSION"
# One directory of symlinks in the layout controller-runtime's envtest expects
# (kube-apiserver, etcd, kubectl), so KUBEBUILDER_ASSETS can point at it.
ASSETS_DIR="$ELASTICPS_CACHE/assets-k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
