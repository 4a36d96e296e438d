# One image for the operator, the parameter servers and the workers: `elasticps operator | ps | worker`.
#
# Built by `make image` (hack/image/build.sh), which first downloads the pinned wheels into
# build/wheels (requirements/image-cpu.lock, or the GPU set), so this file installs offline and
# the image holds exactly the versions of the lock file.
#   make image                      CPU image, elasticps:latest
#   make image VARIANT=gpu          TensorFlow with CUDA libraries, elasticps:latest-gpu
ARG BASE=debian:bookworm-slim
FROM ${BASE}

ARG VARIANT=cpu
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

COPY build/wheels /tmp/wheels
RUN python3 -m venv "$VIRTUAL_ENV" \
    && extra=$([ "$VARIANT" = gpu ] && echo gpu || echo tf) \
    && "$VIRTUAL_ENV/bin/pip" install --no-cache-dir --no-index --find-links /tmp/wheels "elasticps[$extra]" \
    && rm -rf /tmp/wheels \
    && "$VIRTUAL_ENV/bin/elasticps" --help > /dev/null

USER 1000:1000
WORKDIR /home/elasticps
EXPOSE 2222 2223 9090
ENTRYPOINT ["elasticps"]
CMD ["--help"]
