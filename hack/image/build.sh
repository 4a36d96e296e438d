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
# requirements/image-cpu.lock, and served to the build on the loopback (no registry, no wheel layer).
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
# unchanged while they are (see the Dockerfile).
rm -f build/wheels/elasticps-*.whl
rm -rf build/self && mkdir -p build/self
"$PY" -m pip wheel -q --no-deps -w build/self .

# The wheel set: its requirements (name==version from each file name) and its digest (names and
# sizes: a name carries the version, and a release's file never changes on PyPI).
(cd build/wheels && for w in *.whl; do n=${w%%-*}; v=${w#*-}; echo "$n==${v%%-*}"; done) >build/wheels/requirements.txt
digest=$(cd build/wheels && stat -c '%n %s' -- *.whl | sort | sha256sum | cut -c1-32)
# Served on the loopback for the build's RUN (builds use the host's network). The port follows from
# the digest, so a rebuild of the same set passes the same build arguments and Docker's cache holds.
port=$("$PY" - "$digest" <<'PYEOF'
import socket, sys
base = 20000 + int(sys.argv[1][:8], 16) % 20000
for port in range(base, base + 50):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
PYEOF
)
"$PY" -m http.server --bind 127.0.0.1 --directory build/wheels "$port" >build/wheels-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/requirements.txt', timeout=1)" 2>/dev/null && break
  sleep 0.2
done

echo "building $TAG from $BASE ..."
previous=$(docker image inspect "$TAG" --format '{{.Id}}' 2>/dev/null || true)
if ! docker build -q --network host --build-arg "BASE=$BASE" --build-arg "WHEELS_DIGEST=$digest" \
  --build-arg "WHEELS_URL=http://127.0.0.1:$port" -t "$TAG" . >build/docker-build.log 2>&1; then
  tail -30 build/docker-build.log >&2
  echo "docker build of $TAG failed; the disk:" >&2
  df -h . "$STATE" >&2 || true
  exit 1
fi
# The wheels are in the image's environment now: they would only fill the disk (GBs for torch).
rm -rf build/wheels build/self
# Every build of a changed tree leaves the image it replaced untagged: drop it (its layers shared
# with the new one stay). The dependencies' stage of earlier builds (elasticps-deps, with the wheels
# in a layer of its own) is no longer used.
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect "$TAG" --format '{{.Id}}')" ]; then
  docker image rm "$previous" >/dev/null 2>&1 || true
fi
docker image rm "elasticps-deps:$VARIANT" >/dev/null 2>&1 || true
docker container prune -f >/dev/null  # a failed build's containers
docker image prune -f >/dev/null
docker image inspect "$TAG" --format "$TAG: {{.Size}} bytes"
