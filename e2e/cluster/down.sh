#!/usr/bin/env bash
# Stops every component of the local cluster started by up.sh and removes its state folder
# (certificates, etcd data, kubeconfigs, logs). Safe to run when nothing is up.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
lock_cluster

pids=()
# Stop in reverse start order so controllers do not log errors about a vanished API server.
for ((i = ${#components[@]} - 1; i >= 0; i--)); do
  c=${components[$i]}
  pid=$(component_pid "$c")
  [ -n "$pid" ] || continue
  log "Stopping $c (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  pids+=("$pid")
done
deadline=$(( $(date +%s) + 15 ))
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "Killing pid $pid, still running after 15 s"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
done
if is_cluster_state; then
  rm -rf "$state"
  log "Removed $state"
elif [ -d "$state" ]; then
  # Never delete a folder up.sh did not create (INFERFLEET_CLUSTER_STATE may point anywhere).
  rmdir "$state" 2>/dev/null || log "Left $state in place: up.sh did not create it"
fi
