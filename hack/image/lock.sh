#!/usr/bin/env bash
# Regenerates requirements/image-cpu.lock: the exact versions `pip install .[tf]` resolves today.
set -euo pipefail
cd "$(dirname "$0")/../.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --upgrade pip
"$scratch/venv/bin/pip" install -q ".[tf]"
{ echo "# Pinned runtime set of the CPU image (elasticps[tf]); regenerate with hack/image/lock.sh."
  "$scratch/venv/bin/pip" freeze --all --exclude elasticps --exclude pip; } >requirements/image-cpu.lock
