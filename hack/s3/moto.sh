#!/usr/bin/env bash
# Installs moto's S3-compatible server into its own virtual environment (~/.cache/elasticps/moto):
# the object-store tests (tests/data/test_object_store.py) start it as a separate process on
# loopback and read real S3 objects through elasticps.storage.
#
# Why not the project's dev extra: moto needs botocore, which pins python-dateutil<3, while the
# kubernetes client (>=37) needs python-dateutil>=3; in one environment pip would downgrade the
# kubernetes client. The server is a separate process anyway, so it gets a separate environment.
# Prints the server's path. Idempotent: a no-op once installed.
set -euo pipefail
MOTO_VERSION=5.2.5
home=${ELASTICPS_MOTO_VENV:-$HOME/.cache/elasticps/moto-$MOTO_VERSION}
server="$home/bin/moto_server"
if [ ! -f "$home/.installed" ]; then
  rm -rf "$home"
  python3 -m venv "$home"
  "$home/bin/pip" install -q "moto[server]==$MOTO_VERSION"
  touch "$home/.installed"  # last: an interrupted install is redone
fi
echo "$server"
