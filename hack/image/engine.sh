#!/usr/bin/env bash
# A Docker engine to build and run the image on a machine that has none running.
#
#   eval "$(bash hack/image/engine.sh start)"   # prints DOCKER_HOST when it had to start one
#   bash hack/image/engine.sh stop              # stops the engine this script started
#
# If an engine already answers, nothing is started. Otherwise Debian's docker.io is installed when
# missing (as root, through apt) and dockerd runs with its state under ~/.cache/elasticps/docker:
# no iptables and no bridge (containers run with --network none; builds use the host's network),
# which is what runs in a sandbox without those kernel features. Exit code 3: no engine can run here.
set -euo pipefail
STATE=${ELASTICPS_DOCKER_DIR:-$HOME/.cache/elasticps/docker}
SOCK="$STATE/docker.sock"

case "${1:-}" in
start)
  if docker info >/dev/null 2>&1; then exit 0; fi
  if DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then echo "export DOCKER_HOST=unix://$SOCK"; exit 0; fi
  if ! command -v dockerd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "installing Debian's docker.io ..." >&2
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io; } >&2 \
        || { echo "cannot install docker.io" >&2; exit 3; }
    else
      echo "no dockerd, and not root to install docker.io" >&2; exit 3
    fi
  fi
  mkdir -p "$STATE"
  # A dockerd killed with its session leaves its pid file behind, and a new one refuses to start
  # while it exists: a pid file whose process is not a running dockerd is stale.
  if [ -f "$STATE/dockerd.pid" ]; then
    pid=$(cat "$STATE/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = dockerd ]; then
      echo "a dockerd (pid $pid) owns $STATE but does not answer on $SOCK" >&2; exit 3
    fi
    rm -f "$STATE/dockerd.pid"
  fi
  nohup dockerd --iptables=false --bridge=none --data-root "$STATE/data" --exec-root "$STATE/exec" \
    --pidfile "$STATE/dockerd.pid" -H "unix://$SOCK" >"$STATE/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    if DOCKER_HOST="unix://$SOCK" docker info >/dev/null 2>&1; then echo "export DOCKER_HOST=unix://$SOCK"; exit 0; fi
    sleep 0.5
  done
  echo "dockerd did not come up; its log:" >&2; tail -5 "$STATE/dockerd.log" >&2; exit 3
  ;;
stop)
  if [ -f "$STATE/dockerd.pid" ]; then
    kill "$(cat "$STATE/dockerd.pid")" 2>/dev/null || true
    for _ in $(seq 1 40); do [ -f "$STATE/dockerd.pid" ] || break; sleep 0.25; done
  fi
  ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
