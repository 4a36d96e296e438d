# One image for the operator, the parameter servers and the workers: `elasticps operator | ps | worker`.
#
# Built by `make image` (hack/image/build.sh), which first downloads the pinned wheels into
# build/wheels (requirements/image-cpu.lock, or the GPU set), so this file installs offline and
# the image holds exactly the versions of the lock file.
#   make image                      CPU image, elasticps:latest
#   make image VARIANT=gpu          TensorFlow with CUDA libraries, elasticps:latest-gpu
#   make image VARIANT=torch        PyTorch workers (no TensorFlow), elasticps:latest-torch
ARG BASE=debian:bookworm-slim

# The dependencies are installed in a stage of their own, so the wheels (GBs for torch) stay out of
# the image: only the installed environment is copied into it. build/wheels holds them all and
# nothing else (hack/image/build.sh resolved them for the variant), so this stage and the image
# layer copied from it are the same from one commit to the next: Docker's cache reuses them (build.sh
# keeps this stage tagged, elasticps-deps:VARIANT), and a node's containerd already holds them. Only
# elasticps itself (build/self) is a new layer.
FROM ${BASE} AS install
COPY build/wheels /tmp/wheels
RUN python3 -m venv /opt/elasticps \
    && /opt/elasticps/bin/pip install --no-cache-dir --no-index --no-deps /tmp/wheels/*.whl

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

COPY --from=install /opt/elasticps /opt/elasticps
COPY build/self /tmp/self
RUN /opt/elasticps/bin/pip install --no-cache-dir --no-index --no-deps /tmp/self/*.whl \
    && rm -rf /tmp/self && /opt/elasticps/bin/pip check && elasticps --help > /dev/null

USER 1000:1000
WORKDIR /home/elasticps
EXPOSE 2222 2223 9090
ENTRYPOINT ["elasticps"]
CMD ["--help"]
