# Shared by up.sh and down.sh: where the cluster keeps its state, how to find the binaries,
# and how to tell a component process of this cluster from any other process.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
state=${INFERFLEET_CLUSTER_STATE:-$root/e2e/.state}
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
marker=.inferfleet-cluster  # up.sh creates it first; down.sh deletes only folders that carry it

log() { echo "[cluster] $*" >&2; }

cluster_bin() {
  if [ -n "${INFERFLEET_CLUSTER_BIN:-}" ]; then echo "$INFERFLEET_CLUSTER_BIN"; else bash "$root/e2e/cluster/build.sh"; fi
}

# Prints the pid of a running component of this cluster, or nothing. A pid counts only when its
# command line names this state folder, so a recycled pid is never mistaken for ours.
component_pid() {
  local pid
  pid=$(cat "$state/run/$1.pid" 2>/dev/null) || return 0
  [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$state/" && echo "$pid"
  return 0
}

# Serialises up.sh and down.sh for one state folder (several test sessions may share a cluster).
# The lock is a folder outside the state folder (down.sh removes that) holding the owner's pid, so
# no child process can inherit it and a lock left by a killed script is recognised as stale. A
# nested call (up.sh running down.sh) inherits the lock through the environment.
lock_cluster() {
  [ -n "${INFERFLEET_CLUSTER_LOCKED:-}" ] && return 0
  lock_dir="${TMPDIR:-/tmp}/inferfleet-cluster-$(echo "$state" | sha256sum | cut -c1-12).lock.d"
  local deadline=$(( $(date +%s) + 180 )) owner
  until mkdir "$lock_dir" 2>/dev/null; do
    owner=$(cat "$lock_dir/pid" 2>/dev/null || true)
    if { [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; } ||
       { [ -z "$owner" ] && [ -n "$(find "$lock_dir" -maxdepth 0 -mmin +1 2>/dev/null)" ]; }; then
      rm -rf "$lock_dir"  # its owner is gone
      continue
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "Gave up after 180 s waiting for pid ${owner:-?} (up.sh or down.sh on $state)"
      exit 1
    fi
    sleep 0.2
  done
  echo $$ > "$lock_dir/pid"
  trap 'rm -rf "$lock_dir"' EXIT
  export INFERFLEET_CLUSTER_LOCKED=1
}

# Whether the state folder is one up.sh made (the marker; older clusters: its ports.env and pki/).
is_cluster_state() {
  [ -f "$state/$marker" ] || { [ -f "$state/ports.env" ] && [ -d "$state/pki" ]; }
}
