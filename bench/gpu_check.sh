#!/usr/bin/env bash
# Issue 36's GPU check (bench/gpu_check.py) on a lent GPU machine. That machine has torch, grpcio,
# numpy and pyarrow and reaches no registry: elasticps's other packages travel as wheels made here
# by `make gpu-wheels` (build/gpu-wheels, for Python 3.10-3.13), given to the device tool as carry:
#   run(command="bash bench/gpu_check.sh", carry=["build/gpu-wheels"], timeout_s=540)
# The figures come back in $OUT/gpu_check.json; the table is printed.
set -euo pipefail
python3 -m venv --system-site-packages /tmp/gpu-check-venv
PY=/tmp/gpu-check-venv/bin/python
for pkg in grpc_health:grpcio-health-checking google.protobuf:protobuf yaml:PyYAML tqdm:tqdm \
  prometheus_client:prometheus-client google_crc32c:google-crc32c fsspec:fsspec safetensors:safetensors; do
  module=${pkg%%:*} dist=${pkg#*:}
  "$PY" -c "import $module" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --find-links build/gpu-wheels "$dist"
done
nvidia-smi --query-gpu=name,memory.total,utilization.gpu --format=csv || true
# elasticps from the tree (no install): the local runner starts its replicas as `python -m elasticps`.
PYTHONPATH=$PWD timeout 500 "$PY" -m bench.gpu_check "$@"
