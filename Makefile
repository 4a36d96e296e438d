# elasticps: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOB ?= examples/mnist.yaml
MNIST_DIR ?= ../shared/data/mnist
TFRECORD_DIR ?= $(HOME)/.cache/elasticps/data/mnist-tfrecord
FASHION_DIR ?= /usr/share/datasets/fashion-mnist
VARIANT ?= cpu

.PHONY: run test unit e2e-node lint typecheck bench bench-embedding-scale bench-large bench-peer bench-torch-peer gpu-wheels bench-heterogeneity bench-async bench-identity bench-kills soak convergence scale proto manifests docs image clean mnist-tfrecord

# A virtual environment with the package and its development tools, rebuilt when pyproject changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# MNIST from ../shared/data/mnist when present; elsewhere Fashion-MNIST, installed from Debian's
# package (never downloaded at run time).
run: $(STAMP)
	@if [ "$(JOB)" != examples/mnist.yaml ] || [ -f $(MNIST_DIR)/train-images-idx3-ubyte.gz ]; then \
		$(VENV)/bin/elasticps run $(JOB); \
	else \
		echo "no MNIST in $(MNIST_DIR): training Fashion-MNIST from Debian's dataset-fashion-mnist"; \
		test -d $(FASHION_DIR) || { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; }; \
		$(VENV)/bin/elasticps run examples/fashion-mnist.yaml; \
	fi

# The whole suite, the operator's tests against a real control plane (tests/e2e_cluster) included.
test: $(STAMP) lint typecheck cluster-binaries
	$(PY) -m pytest -q

unit: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not cluster"

# Kubernetes 1.34 control plane + kwok for the cluster tests, built from Go modules into
# ~/.cache/elasticps (about 18 min cold on 2 cores; a no-op once cached). Without Go and without a
# cache the cluster tests are skipped and say why, so `make test` still runs everything else.
cluster-binaries:
	@bash hack/cluster/build.sh || echo "hack/cluster/build.sh failed: the cluster tests will say why"

# A cluster to try the operator by hand: eval "$$(python3 hack/cluster/cluster.py env)", then
# kubectl apply -f manifests/crd.yaml and .venv/bin/elasticps operator. REAL_NODE=1 adds a real node
# that runs the pods (root, containerd: README "On one machine"), also to a cluster already up.
# PURGE=1: down also deletes the state and what the real node left on the host.
cluster-up: cluster-binaries
	$(PYTHON) hack/cluster/cluster.py up $(if $(REAL_NODE),--real-node)

cluster-down:
	$(PYTHON) hack/cluster/cluster.py down $(if $(PURGE),--purge)

# TrainingJobs that really train on a real node (kubelet + containerd beside the kwok nodes): needs
# root, containerd, runc and the CNI plugins (hack/cluster/README.md); part of `make test` too.
# ELASTICPS_REUSE_IMAGE=1 skips rebuilding the image when Docker has one.
e2e-node: $(STAMP) cluster-binaries
	$(PY) -m pytest -q -rs tests/e2e_node

lint: $(STAMP)
	$(VENV)/bin/lint-imports --config pyproject.toml

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The 23M-parameter sync job (bench-large), the PS data path against its ceiling (bench/run.py), then
# elasticps against TensorFlow's ParameterServerStrategy on one MNIST job (bench/peer.py), then embedding
# pull + push against its numpy ceiling (bench/embeddings.py), then a row policy's AUC and rows on the Criteo
# sample (bench/row_policy.py); each
# rewrites only its own section of docs/benchmarks.md (or its own page).
bench: $(STAMP) bench-large
	$(PY) -m bench.run
	$(PY) -m bench.peer $(PEER_ARGS)
	$(PY) -m bench.embeddings
	$(PY) -m bench.row_policy

# Only the comparison with TensorFlow's ParameterServerStrategy: 1 PS + 2 workers, the peer, elasticps
# sync, async and async + staleness-aware lr, interleaved, median of 3 rounds (about 10 minutes on 2
# quiet cores). PEER_ARGS=--repeats 1 for a quick look.
PEER_ARGS ?=
bench-peer: $(STAMP)
	$(PY) -m bench.peer $(PEER_ARGS)

# Issue 38: a stream of about 100M new ids through a capped 2-PS async job, PS memory over time
# against the cap's bound, and the AUC capped or not (docs/embeddings.md). About 70 minutes at
# 2,400 records/s; SCALE_ARGS="--records 1000000 --cap 500000" for a smaller stream.
SCALE_ARGS ?=
bench-embedding-scale: $(STAMP)
	$(PY) -m bench.embedding_scale $(SCALE_ARGS)

# Issue 36: elasticps with PyTorch workers (sync, async; 1 PS + 2 workers) against PyTorch
# DistributedDataParallel over gloo and seed 001's all-reduce SSGD (one all_reduce per parameter) on
# examples/mnist-torch.yaml, 2 interleaved rounds (about 8 minutes on 2 quiet cores, 15 on busy ones):
# examples/s in the last epoch and test accuracy (docs/benchmarks.md).
TORCH_PEER_ARGS ?=
bench-torch-peer: $(STAMP)
	$(PY) -m bench.torch_peer $(TORCH_PEER_ARGS)

# Issue 15: every training mode under no slowdown, random 6x steps and a 4x straggler, 4 workers on
# MNIST, medians of 3 interleaved repetitions (about 2 hours on 2 cores): docs/heterogeneity.md.
# Beside `make bench`, not in it. HETEROGENEITY_ARGS="--modes sync,localsgd4 --slowdowns straggler4".
# Issue 36's GPU check: `bash bench/gpu_check.sh` on a lent GPU machine (bench/gpu_check.py: 2 PS + 1
# torch worker training ResNet-50 on the GPU against the model alone); its packages beyond torch,
# grpcio, numpy and pyarrow come from here as wheels: build/gpu-wheels, carried to the device.
GPU_WHEELS := grpcio-health-checking protobuf PyYAML tqdm prometheus-client google-crc32c fsspec safetensors
gpu-wheels: $(STAMP)
	rm -rf build/gpu-wheels && mkdir -p build/gpu-wheels
	for v in 3.10 3.11 3.12 3.13; do $(PY) -m pip download -q --only-binary=:all: --no-deps --python-version $$v \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -d build/gpu-wheels $(GPU_WHEELS) || exit 1; done
	du -sh build/gpu-wheels

bench-heterogeneity: $(STAMP)
	$(PY) -m bench.heterogeneity $(HETEROGENEITY_ARGS)

# Issue 14's job: a 23M-parameter MLP, 6,400 MNIST records, 2 PS + 2 workers, sync, against one
# process on the same minibatches: rejections, the time ratio, bytes per shard, PS memory per
# parameter byte (docs/large-model.md, bench/results/large_model.json). Skipped without MNIST.
bench-large: $(STAMP)
	$(PY) -m bench.large_model --mnist $(MNIST_DIR)

# 32 async fake workers for 5 minutes against 2 PS while malformed calls arrive at 10/s: failed
# legitimate calls, PS memory, the model finite (docs/reliability.md). Not part of `make test`.
soak: $(STAMP)
	$(PY) -m bench.soak

# The operator at 2 PS + 256 and 1,024 workers on a kwok cluster tuned for it (12 nodes x 110 pods; the
# scheduler, controller-manager and kwok with raised client rates), at a given QPS and at its default,
# alone and behind Kueue: time to status, last create, all Running, requests per pod, peak QPS,
# deletion, and each as a ratio of a bare `kubectl create` of the same pods in the same sitting
# (docs/operator-scale.md). Not part of `make bench`: it brings up its own control plane (about 25
# minutes on 2 cores).
SCALE_ARGS ?=
scale: $(STAMP) cluster-binaries
	$(PY) -m bench.operator_scale $(SCALE_ARGS)

# Issue 33: how reliably each async mode converges (plain, staleness lr, each compensation, SSP
# k=2/4/8, sync as reference) x seeds 1-10 x two learning rates x 2 and 8 workers, interleaved
# (hours on 2 cores; docs/convergence.md). ASYNC_ARGS="--modes async,async-none --workers 2 --seeds 1-10".
ASYNC_ARGS ?=
bench-async: $(STAMP)
	$(PY) -m bench.async_convergence $(ASYNC_ARGS)

# Issue 35: job identity's cost on the data path: PS round trips with a job key and a worker's
# token against the same without, interleaved in one run (bench/results/identity.json).
bench-identity: $(STAMP)
	$(PY) -m bench.identity_cost $(IDENTITY_ARGS)

# Issue 33: 20 local jobs, each with one PS killed -9 at a random moment (every 4th after the last
# training task): all must end Succeeded with every record counted once (docs/reliability.md).
bench-kills: $(STAMP)
	$(PY) -m bench.end_kills

# Sync against async MNIST: test accuracy over wall time (docs/convergence.md).
convergence: $(STAMP)
	$(PY) -m bench.convergence

# Regenerates elasticps/proto/*_pb2*.py and the .pyi stubs from the .proto files.
proto: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	$(CURDIR)/$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
		--mypy_out=. --mypy_grpc_out=. elasticps/proto/elasticps.proto
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	$(CURDIR)/$(PY) -m grpc_tools.protoc -I. --python_out=. --mypy_out=. elasticps/proto/tensorboard.proto

# Regenerates the CRD from the typed spec (a test keeps the committed file equal to it).
manifests: $(STAMP)
	$(PY) -m elasticps.api.schema > manifests/crd.yaml
	cp manifests/crd.yaml helm/elasticps/crds/crd.yaml

# The container image for the operator, the PS and the workers (Dockerfile; hack/image/build.sh):
# make image, or make image VARIANT=gpu.
# The TrainingJob reference, generated from the CRD's schema (a test keeps it current).
docs: $(STAMP)
	$(PY) -m elasticps.api.reference > docs/trainingjob.md

# MNIST as TFRecord files of tf.train.Example for examples/mnist-tfrecord.yaml, outside the
# repository (a no-op when they are there).
mnist-tfrecord: $(STAMP)
	$(PY) -m elasticps.backends.keras.mnist_tfrecord --mnist $(MNIST_DIR) --out $(TFRECORD_DIR)

image: $(STAMP)
	VARIANT=$(VARIANT) PY=$(PY) bash hack/image/build.sh

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache
