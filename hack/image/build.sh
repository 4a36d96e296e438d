#!/usr/bin/env bash
# Builds the elasticps image (the Dockerfile) with an engine from hack/image/engine.sh.
#
#   bash hack/image/build.sh                 # CPU image elasticps:latest
#   VARIANT=gpu bash hack/image/build.sh     # GPU image elasticps:latest-gpu (TensorFlow with CUDA)
#   VARIANT=torch bash hack/image/build.sh   # elasticps:latest-torch: PyTorch workers, no TensorFlow
#
# No registry is needed: the base image is BASE if the engine has it (e.g. debian:bookworm-slim
# pulled elsewhere), else one made here by debootstrap from Debian's archive and `docker import`;
# the Python packages are downloaded on this machine into build/wheels, pinned by
# requirements/image-cpu.lock, and installed offline inside the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
VARIANT=${VARIANT:-cpu}
TAG=${TAG:-elasticps:latest$(case "$VARIANT" in gpu | torch) echo "-$VARIANT" ;; esac)}
PY=${PY:-.venv/bin/python}
BASE=${BASE:-debian:bookworm-slim}
STATE=${ELASTICPS_DOCKER_DIR:-$HOME/.cache/elasticps/docker}

eval "$(bash hack/image/engine.sh start)"

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  BASE=elasticps-base:bookworm
  if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "making the base image $BASE with debootstrap (about a minute) ..."
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
    rootfs="$STATE/rootfs-bookworm"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
      http://deb.debian.org/debian >"$STATE/debootstrap.log" 2>&1
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import - "$BASE" >/dev/null
    rm -rf "$rootfs"
  fi
fi

echo "downloading the pinned wheels into build/wheels ..."
rm -rf build/wheels && mkdir -p build/wheels
if [ "$VARIANT" = gpu ]; then
  # TensorFlow with CUDA replaces tensorflow-cpu; every package both sets share keeps its pin.
  grep -v '^tensorflow-cpu==' requirements/image-cpu.lock >build/gpu-constraints.txt
  "$PY" -m pip download -q --only-binary=:all: -c build/gpu-constraints.txt -d build/wheels ".[gpu]"
elif [ "$VARIANT" = torch ]; then
  # PyPI's Linux torch wheel carries CUDA (its nvidia-* packages, about 3 GB): the same image runs
  # torch workers on a GPU node and on a CPU one. The lock's pins hold for every package it names.
  grep -v '^tensorflow' requirements/image-cpu.lock >build/torch-constraints.txt
  "$PY" -m pip download -q --only-binary=:all: -c build/torch-constraints.txt -d build/wheels ".[torch]"
else
  "$PY" -m pip download -q --only-binary=:all: --no-deps -r requirements/image-cpu.lock -d build/wheels
fi
# elasticps itself goes apart (build/self): the dependency wheels alone make the image's big layer,
# unchanged while the lock is (see the Dockerfile).
rm -f build/wheels/elasticps-*.whl
rm -rf build/self && mkdir -p build/self
"$PY" -m pip wheel -q --no-deps -w build/self .

echo "building $TAG from $BASE ..."
previous=$(docker image inspect "$TAG" --format '{{.Id}}' 2>/dev/null || true)
# The dependencies' stage first, under a tag of its own: kept, it is the build cache that makes the
# next build reuse the image's big layer (an untagged stage would be pruned below, and Docker's
# legacy builder would install everything again into a layer of another digest).
docker build -q --network host --build-arg "BASE=$BASE" --target install -t "elasticps-deps:$VARIANT" . >/dev/null
docker build -q --network host --build-arg "BASE=$BASE" -t "$TAG" . >/dev/null
# Every build of a changed tree leaves the image it replaced untagged: drop it (its layers shared
# with the new one stay).
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect "$TAG" --format '{{.Id}}')" ]; then
  docker image rm "$previous" >/dev/null 2>&1 || true
fi
docker image prune -f >/dev/null  # the install stage's image (it holds the wheels) is left untagged too
docker image inspect "$TAG" --format "$TAG: {{.Size}} bytes"
