# Shared by the kind scripts: pins, cache folders, logging, and whether this host needs the
# unprivileged workaround for kind's `docker run --privileged`.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/e2e/kind"
# shellcheck source=../cluster/pins.env
source "$root/e2e/cluster/pins.env"
# shellcheck source=pins.env
source "$here/pins.env"
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}

# This work tree's kind clusters: the demo's (e2e/kind/demo.sh; it stays up afterwards) and the test tier's
# (INFERFLEET_KIND_ROLE=tests, set by e2e/kind/conftest.py), so the tests neither depend on nor disturb what
# the demo left running, and the demo never meets a test's release. INFERFLEET_KIND_CLUSTER and
# INFERFLEET_KIND_STATE name another cluster and state folder outright.
case "${INFERFLEET_KIND_ROLE:-demo}" in
  demo) role_suffix= ;;
  tests) role_suffix=-tests ;;
  *) echo "[kind] INFERFLEET_KIND_ROLE must be demo or tests, not '${INFERFLEET_KIND_ROLE}'" >&2; exit 2 ;;
esac
cluster=${INFERFLEET_KIND_CLUSTER:-inferfleet-$(echo "$root" | sha256sum | cut -c1-6)$role_suffix}
state=${INFERFLEET_KIND_STATE:-$root/e2e/.state-kind$role_suffix}

# The test tier's worker node: the node class that makes it a pool of its own, and the host cores it may use.
WORKER_CLASS=${INFERFLEET_KIND_WORKER_CLASS:-small}
WORKER_CPUS=${INFERFLEET_KIND_WORKER_CPUS:-0.25}

log() { echo "[kind] $*" >&2; }

# Exit 0 when a privileged container cannot start here (the known failure, nothing else), so the
# docker shim and the node prelude are needed; the image used is one that is already present.
needs_unprivileged_workaround() {
  local image=$1 out
  out=$(docker run --rm --privileged --entrypoint true "$image" 2>&1) && return 1
  case "$out" in
    *"apply caps"*|*"operation not permitted"*) return 0 ;;
    *) log "docker run --privileged failed: $out"; return 1 ;;
  esac
}

# The docker flags that replace --privileged where it fails (the same as docker-shim/docker's).
unprivileged_run_flags=(--cap-add=ALL --cap-drop=SYS_RESOURCE --security-opt seccomp=unconfined
  --security-opt apparmor=unconfined --security-opt systempaths=unconfined
  "--device-cgroup-rule=a *:* rwm" --device=/dev/kmsg)

# Whether kind lists the cluster. The listing is read whole first: `kind get clusters | grep -q` under pipefail
# fails when grep exits at the first match while kind still writes (SIGPIPE), which happens with two clusters.
has_kind_cluster() {
  local kind_bin=$1 name=$2 clusters
  clusters=$("$kind_bin" get clusters 2>/dev/null) || return 1
  grep -qxF "$name" <<<"$clusters"
}

# Deletes every other inferfleet-* kind cluster whose node container is not running: after a reboot or a stopped
# Docker engine such clusters are dead (up.sh would delete and recreate them anyway), and each holds a copy of the
# runtime image, so clusters of clones that are gone would otherwise fill the disk one image at a time.
delete_stopped_clusters() {
  local kind_bin=$1 keep=$2 clusters name
  clusters=$("$kind_bin" get clusters 2>/dev/null) || return 0
  for name in $clusters; do
    case "$name" in inferfleet-*) ;; *) continue ;; esac
    [ "$name" != "$keep" ] || continue
    [ "$(docker inspect -f '{{.State.Running}}' "$name-control-plane" 2>/dev/null)" != true ] || continue
    "$kind_bin" delete cluster --name "$name" >/dev/null 2>&1 && log "Deleted kind cluster $name (its node was not running)"
  done
}

# Loads a local image into one kind node's containerd, streamed (no copy of it on the host's disk, where
# `kind load` writes one), and drops the imported layer blobs once containerd has unpacked them (what containerd
# calls discarding unpacked layers): the node then holds the image once, as its snapshots, instead of twice. Each
# layer blob's digest is the layer's diff ID, since `docker save` writes the layers uncompressed.
load_image() {
  local image=$1 node=$2 layers
  docker save "$image" | docker exec -i "$node" ctr -n k8s.io images import --digests --snapshotter=overlayfs - >/dev/null
  docker exec "$node" crictl inspecti -q "docker.io/$image" >/dev/null
  mapfile -t layers < <(docker image inspect -f '{{range .RootFS.Layers}}{{println .}}{{end}}' "$image" | sed '/^$/d')
  # A layer another image on the node shares may already be gone: each is removed on its own.
  for layer in "${layers[@]}"; do docker exec "$node" ctr -n k8s.io content rm "$layer" >/dev/null 2>&1 || true; done
}
