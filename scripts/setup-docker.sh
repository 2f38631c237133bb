#!/usr/bin/env bash
# Docker for the `docker` sandbox backend (idempotent; run as root on Debian 12, as `.ci/run` does):
#   1. install docker.io with apt when `dockerd` is missing;
#   2. start dockerd in the background when no daemon answers (`docker info`), with its state under
#      $HARNESSRL_DOCKER_ROOT (default /var/lib/harnessrl-docker), the default socket
#      /var/run/docker.sock, no bridge network and no iptables rules (sandboxes use network "none"),
#      and wait up to 30 s until `docker info` answers;
#   3. build the sandbox image from local files when the tag for this checkout is absent
#      (`python -m tasks.environments.sandbox.image build`; see infra/sandbox/README.md).
# A second run with everything in place takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
ROOT=${HARNESSRL_DOCKER_ROOT:-/var/lib/harnessrl-docker}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v dockerd >/dev/null 2>&1; then
  echo "setup-docker: installing docker.io"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends docker.io >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null
    $SUDO apt-get install -y --no-install-recommends docker.io >/dev/null
  }
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup-docker: starting dockerd (state in $ROOT, log $ROOT/dockerd.log)"
  $SUDO mkdir -p "$ROOT/data" "$ROOT/exec"
  # A pid file of ours: the daemon crashed (stale file) or is still shutting down (wait for it).
  if [ -f "$ROOT/dockerd.pid" ]; then
    old=$(cat "$ROOT/dockerd.pid")
    for _ in $(seq 1 40); do kill -0 "$old" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$old" 2>/dev/null; then
      echo "setup-docker: dockerd $old (ours) does not answer; stopping it" >&2
      $SUDO kill "$old"; sleep 3
    fi
    $SUDO rm -f "$ROOT/dockerd.pid"
  fi
  $SUDO sh -c "nohup dockerd --data-root '$ROOT/data' --exec-root '$ROOT/exec' \
    -H unix:///var/run/docker.sock --pidfile '$ROOT/dockerd.pid' \
    --bridge=none --iptables=false --ip6tables=false >>'$ROOT/dockerd.log' 2>&1 &"
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "setup-docker: dockerd did not start; last log lines:" >&2; tail -20 "$ROOT/dockerd.log" >&2; exit 1; }
fi

"$PY" -m tasks.environments.sandbox.image build
