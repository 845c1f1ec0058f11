#!/usr/bin/env bash
# Makes sure a Docker engine answers: reuses one that runs (whoever started it), otherwise installs
# Debian's docker.io when there is no dockerd and starts dockerd in the background with its log and
# pid file under the cache. Stops nothing: a daemon these scripts did not start is never touched.
# Prints nothing on stdout; progress goes to stderr. Exit 1 with one line when Docker cannot run.
set -euo pipefail
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}
run_dir="$cache/docker"
log() { echo "[docker] $*" >&2; }

if docker info >/dev/null 2>&1; then exit 0; fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi; }

if ! command -v dockerd >/dev/null; then
  command -v apt-get >/dev/null || { log "No Docker daemon and no apt-get to install docker.io: install Docker by hand"; exit 1; }
  log "Installing docker.io with apt (no dockerd on this machine)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
    { log "apt-get update failed (root or sudo needed)"; exit 1; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io >&2 || { log "apt-get install docker.io failed"; exit 1; }
fi

mkdir -p "$run_dir"
pid=$(cat "$run_dir/dockerd.pid" 2>/dev/null || true)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q dockerd "/proc/$pid/cmdline" 2>/dev/null; then
  log "dockerd (pid $pid, started by these scripts) is running but does not answer yet"
else
  # A socket that a dead daemon left behind would make the new one refuse to start; one that a live
  # daemon owns makes `docker info` above succeed, so removing a stale one here is safe.
  if [ -S /var/run/docker.sock ] && ! docker info >/dev/null 2>&1 && ! pgrep -x dockerd >/dev/null; then
    as_root rm -f /var/run/docker.sock
  fi
  if pgrep -x dockerd >/dev/null; then
    log "A dockerd that these scripts did not start runs but does not answer: fix it or stop it by hand"
    exit 1
  fi
  log "Starting dockerd (log: $run_dir/dockerd.log)"
  as_root sh -c "setsid dockerd --pidfile '$run_dir/dockerd.pid' >>'$run_dir/dockerd.log' 2>&1 < /dev/null &" ||
    { log "Could not start dockerd (root or sudo needed)"; exit 1; }
fi
for _ in $(seq 1 120); do
  docker info >/dev/null 2>&1 && { log "dockerd answers"; exit 0; }
  sleep 0.5
done
log "dockerd did not answer within 60 s; see $run_dir/dockerd.log"
exit 1
