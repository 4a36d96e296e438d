# One image for the operator, the parameter servers and the workers: `elasticps operator | ps | worker`.
#
# Built by `make image` (hack/image/build.sh), which first downloads the pinned wheels into
# build/wheels (requirements/image-cpu.lock, or the GPU set) and serves them to the build: this file
# installs from those wheels alone, and the image holds exactly the versions of the lock file.
#   make image                      CPU image, elasticps:latest
#   make image VARIANT=gpu          TensorFlow with CUDA libraries, elasticps:latest-gpu
#   make image VARIANT=torch        PyTorch workers (no TensorFlow), elasticps:latest-torch
ARG BASE=debian:bookworm-slim

# One stage. The dependencies are installed from build/wheels, which hack/image/build.sh resolved
# for the variant and serves on the host's loopback for the build (WHEELS_URL, builds use the host's
# network): the wheels (GBs for torch) never become a layer, and the installed environment is held
# once. WHEELS_DIGEST names the wheel set, so Docker's cache reuses the environment's layer exactly
# while the set is the same, and a node's containerd already holds it; only elasticps itself
# (build/self) is a new layer from one commit to the next.
FROM ${BASE}
ENV VIRTUAL_ENV=/opt/elasticps \
    PATH=/opt/elasticps/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MALLOC_MMAP_THRESHOLD_=1073741824 \
    MALLOC_TRIM_THRESHOLD_=2147483648 \
    HOME=/home/elasticps

# A fixed non-root user: pods run with runAsNonRoot and runAsUser 1000.
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin elasticps

ARG WHEELS_DIGEST
ARG WHEELS_URL
RUN test -n "$WHEELS_DIGEST" && python3 -m venv /opt/elasticps \
    && /opt/elasticps/bin/pip install --no-cache-dir --no-index --no-deps --trusted-host 127.0.0.1 \
        --find-links "$WHEELS_URL/" -r "$WHEELS_URL/requirements.txt"

COPY build/self /tmp/self
RUN /opt/elasticps/bin/pip install --no-cache-dir --no-index --no-deps /tmp/self/*.whl \
    && rm -rf /tmp/self && /opt/elasticps/bin/pip check && elasticps --help > /dev/null

USER 1000:1000
WORKDIR /home/elasticps
EXPOSE 2222 2223 9090
ENTRYPOINT ["elasticps"]
CMD ["--help"]
