# Shared by up.sh and down.sh: where the cluster keeps its state, how to find the binaries,
# and how to tell a component process of this cluster from any other process.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
state=${INFERFLEET_CLUSTER_STATE:-$root/e2e/.state}
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

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
# The lock lives outside the state folder, which down.sh removes; a nested call (up.sh running
# down.sh) inherits the lock.
lock_cluster() {
  [ -n "${INFERFLEET_CLUSTER_LOCKED:-}" ] && return 0
  exec 9>"${TMPDIR:-/tmp}/inferfleet-cluster-$(echo "$state" | sha256sum | cut -c1-12).lock"
  flock 9
  export INFERFLEET_CLUSTER_LOCKED=1
}
