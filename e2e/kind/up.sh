#!/usr/bin/env bash
# Brings up (or reuses) this work tree's kind cluster with real CPU capacity and simulated GPU
# pools: Docker engine, the project's images, a node image at the pinned Kubernetes version, one
# control-plane node that also runs workloads (and, for the test tier, a smaller real worker node
# that is a pool of its own), the images loaded, the KWOK controller deployed into the cluster with
# the NVIDIA/AMD/Intel fake nodes from e2e/nodes/. Writes $state/env (KUBECONFIG, image names,
# cluster name, nodes) and prints its path on stdout; progress with timings on stderr.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mkdir -p "$state/models"
began=$(date +%s)
step() { log "$* (at $(( $(date +%s) - began )) s)"; }

step "Docker engine"
bash "$here/docker.sh"
step "Images (built only when their inputs changed)"
images=$(bash "$here/images.sh")
runtime_image=$(echo "$images" | sed -n 's/^runtime=//p')
operator_image=$(echo "$images" | sed -n 's/^operator=//p')
step "Node image for Kubernetes $K8S_VERSION"
node_image=$(bash "$here/node-image.sh")
step "kind $KIND_VERSION and the control-plane tools"
node_bin=$(bash "$here/node-bins.sh")
cp_bin=${INFERFLEET_CLUSTER_BIN:-$(bash "$root/e2e/cluster/build.sh")}
kind=("$node_bin/kind")
kubectl=("$cp_bin/kubectl" --kubeconfig "$state/kubeconfig")

if needs_unprivileged_workaround "$node_image"; then
  log "docker run --privileged fails on this host: kind runs through e2e/kind/docker-shim"
  export INFERFLEET_REAL_DOCKER PATH
  INFERFLEET_REAL_DOCKER=$(command -v docker)
  PATH="$here/docker-shim:$PATH"
fi

node="$cluster-control-plane"
# Real worker nodes: the test tier has one, a smaller machine (WORKER_CPUS of the host's cores) labelled and
# tainted as its own pool (node class $WORKER_CLASS), so routing meets real pods of different speed.
num_workers=${INFERFLEET_KIND_WORKERS:-$([ "${INFERFLEET_KIND_ROLE:-demo}" = tests ] && echo 1 || echo 0)}
workers=()
for i in $(seq 1 "$num_workers"); do workers+=("$cluster-worker$([ "$i" = 1 ] || echo "$i")"); done
if has_kind_cluster "${kind[@]}" "$cluster"; then
  listed=$("${kind[@]}" get nodes --name "$cluster" 2>/dev/null | sort | tr '\n' ' ')
  wanted=$(printf '%s\n' "$node" "${workers[@]}" | sort | tr '\n' ' ')
  if [ "$listed" = "$wanted" ] &&
     [ "$(docker inspect -f '{{.Config.Image}}' "$node" 2>/dev/null)" = "$node_image" ] &&
     [ "$(docker inspect -f '{{.State.Running}}' "$node" 2>/dev/null)" = true ] &&
     "${kind[@]}" get kubeconfig --name "$cluster" > "$state/kubeconfig" 2>/dev/null &&
     "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1; then
    step "Reusing kind cluster $cluster"
  else
    step "Deleting kind cluster $cluster (stale node image, other nodes or not running)"
    "${kind[@]}" delete cluster --name "$cluster" >&2
  fi
fi
if ! has_kind_cluster "${kind[@]}" "$cluster"; then
  delete_stopped_clusters "${kind[@]}" "$cluster"
  step "Creating kind cluster $cluster"
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    # The assembled node image has no kindnetd: its bridge CNI config serves the single node.
    case "$node_image" in inferfleet/*) printf 'networking:\n  disableDefaultCNI: true\n' ;; esac
    echo "nodes:"
    for role in control-plane $(for _ in "${workers[@]}"; do echo worker; done); do
      echo "  - role: $role"
      echo "    extraMounts:"
      echo "      - {hostPath: $state/models, containerPath: /inferfleet-models, readOnly: true}"
    done
    # kubelet >= 1.35 refuses cgroup v1 hosts unless told otherwise.
    if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
      printf 'kubeadmConfigPatches:\n  - |\n    kind: KubeletConfiguration\n    failCgroupV1: false\n'
    fi
  } > "$state/kind-config.yaml"
  "${kind[@]}" create cluster --name "$cluster" --image "$node_image" --config "$state/kind-config.yaml" \
    --kubeconfig "$state/kubeconfig" --wait 180s >&2
fi
if [ "${#workers[@]}" -gt 0 ]; then
  step "Pod network across ${#workers[@]} worker node(s)"
  bash "$here/pod-network.sh" "$state/kubeconfig" "$cp_bin/kubectl" "$node" "${workers[@]}"
  # kind taints the control plane when a cluster has workers; here it runs the workloads as in a one-node cluster.
  "${kubectl[@]}" taint node "$node" node-role.kubernetes.io/control-plane:NoSchedule- >/dev/null 2>&1 || true
  for worker in "${workers[@]}"; do
    "${kubectl[@]}" label node "$worker" "inferfleet.dev/node-class=$WORKER_CLASS" --overwrite >/dev/null
    "${kubectl[@]}" taint node "$worker" "inferfleet.dev/node-class=$WORKER_CLASS:NoSchedule" --overwrite >/dev/null
  done
fi

# A worker gets its few cores only once its images are in: unpacking gigabytes on a quarter of a core takes long.
for worker in "${workers[@]}"; do docker update --cpus "$(nproc)" "$worker" >/dev/null; done
step "Loading images into the node (skipped for those it already has)"
kwok_bin="$cp_bin/kwok"
kwok_image="inferfleet/kwok:$KWOK_VERSION"
if ! docker image inspect "$kwok_image" >/dev/null 2>&1; then
  kwok_ctx=$(mktemp -d); cp "$kwok_bin" "$kwok_ctx/kwok"
  printf 'FROM scratch\nCOPY kwok /kwok\nUSER 65532\nENTRYPOINT ["/kwok"]\n' > "$kwok_ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$kwok_image" "$kwok_ctx" >/dev/null; rm -rf "$kwok_ctx"
fi
for image in "$operator_image" "$kwok_image" "$runtime_image"; do
  id=$(docker image inspect -f '{{.Id}}' "$image")
  missing=()
  for each in "$node" "${workers[@]}"; do
    # Read whole before grep, as in has_kind_cluster: an early grep exit would fail the pipe and reload the image.
    present=$(docker exec "$each" crictl inspecti -q "docker.io/$image" 2>/dev/null || true)
    if ! grep -qF "$id" <<<"$present"; then missing+=("$each"); fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    log "  $image: present"
    continue
  fi
  for each in "${missing[@]}"; do
    # The node's earlier builds of this image first: each is gigabytes of the node's disk, and nothing here
    # runs them once the release moves to this tag (one still running keeps its image: crictl refuses).
    docker exec "$each" crictl images 2>/dev/null | awk -v repo="docker.io/${image%:*}" -v tag="${image##*:}" \
      '$1 == repo && $2 != tag {print $3}' | while read -r old; do
      if docker exec "$each" crictl rmi "$old" >/dev/null 2>&1; then log "  removed an earlier ${image%:*} from $each"; fi
    done
  done
  t=$(date +%s)
  for each in "${missing[@]}"; do
    load_image "$image" "$each" 2>"$state/load.err" ||
      { log "  $image: loading into $each failed (free disk: $(df -h --output=avail "$state" | tail -1)): $(tail -3 "$state/load.err")"; exit 1; }
  done
  log "  $image: loaded into ${#missing[@]} node(s) in $(( $(date +%s) - t )) s"
done

for worker in "${workers[@]}"; do docker update --cpus "$WORKER_CPUS" "$worker" >/dev/null; done
step "KWOK controller and the simulated GPU nodes"
kwok_mod=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
stages="$kwok_mod/kustomize/stage"
for f in "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
  "$stages/pod/fast/pod-ready.yaml" "$stages/pod/fast/pod-delete.yaml" "$root"/e2e/cluster/stages/*.yaml; do
  cat "$f"; echo "---"
done > "$state/kwok-stages.yaml"
"${kubectl[@]}" -n kube-system create configmap kwok-stages --from-file=stages.yaml="$state/kwok-stages.yaml" \
  --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null
sed "s|KWOK_IMAGE|$kwok_image|" "$here/kwok.yaml" | "${kubectl[@]}" apply -f - >/dev/null
"${kubectl[@]}" -n kube-system rollout status deployment/kwok-controller --timeout 120s >&2
for f in nvidia-h100 amd-mi300x intel-max1550; do "${kubectl[@]}" apply -f "$root/e2e/nodes/$f.yaml" >/dev/null; done
# Tainted here (not in the shared fixtures): a pod that does not ask for a simulated GPU node, such as
# the operator's, must land on the real node, or KWOK would "run" it without running anything.
"${kubectl[@]}" taint nodes -l type=kwok kwok.x-k8s.io/node=fake:NoSchedule --overwrite >/dev/null
"${kubectl[@]}" wait --for condition=Ready node --all --timeout 120s >/dev/null
{
  echo "KUBECONFIG=$state/kubeconfig"
  echo "KIND_CLUSTER=$cluster"
  echo "KIND_NODE=$node"
  echo "KIND_WORKERS=${workers[*]}"
  echo "WORKER_CLASS=$WORKER_CLASS"
  echo "RUNTIME_IMAGE=$runtime_image"
  echo "OPERATOR_IMAGE=$operator_image"
  echo "MODELS_DIR=$state/models"
  echo "MODELS_NODE_DIR=/inferfleet-models"
} > "$state/env"
step "kind cluster $cluster up; export KUBECONFIG=$state/kubeconfig"
echo "$state/env"
