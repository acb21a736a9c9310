#!/usr/bin/env bash
# Installs and starts what the test suite needs beyond Python: dockerd (Docker tests), bubblewrap
# (local sandbox), debootstrap (the registry-free base image). Idempotent; a no-op for anything
# already there. Needs root for apt and dockerd; without root it only reports what is missing.
set -euo pipefail
PIDFILE=/tmp/kvagent-dockerd.pid

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)

start() {
  if ((${#need_apt[@]})); then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
    else
      echo "services: missing ${need_apt[*]} and not root: install them, or Docker tests will fail" >&2
      return 0
    fi
  fi
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "services: dockerd is not running and this is not root: start it yourself" >&2
    return 0
  fi
  nohup dockerd >/tmp/kvagent-dockerd.log 2>&1 &
  echo $! >"$PIDFILE"
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "services: dockerd did not come up in 60 s; see /tmp/kvagent-dockerd.log" >&2
  return 1
}

stop() {
  # Only stop a dockerd this script started.
  if [ -f "$PIDFILE" ]; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    rm -f "$PIDFILE"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: services.sh start|stop" >&2; exit 2 ;;
esac
