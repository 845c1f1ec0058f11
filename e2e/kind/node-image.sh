#!/usr/bin/env bash
# Prints the name of a kind node image at the pinned Kubernetes version (e2e/cluster/pins.env).
# Official kindest/node when it is present or can be pulled; otherwise assembled here from parts
# (FACTS: kind's base files, Debian containerd, the pinned Kubernetes binaries, control-plane
# images made from them, imported into the node's containerd), cached by the hash of its inputs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
official="kindest/node:$K8S_VERSION"
bash "$here/docker.sh"
if docker image inspect "$official" >/dev/null 2>&1; then echo "$official"; exit 0; fi
if [ -z "${INFERFLEET_NO_PULL:-}" ] && timeout 60 docker pull -q "$official" >/dev/null 2>&1; then
  log "Pulled $official"; echo "$official"; exit 0
fi
base=$(bash "$here/base-image.sh")
base_id=$(docker image inspect -f '{{.Id}}' "$base")
hash=$( { cat "$root/e2e/cluster/pins.env" "$here/pins.env" "$here/node-image.sh" "$here/node-prelude.sh" \
  "$root/e2e/images/kind-node.Dockerfile"; echo "$base_id"; } | sha256sum | cut -c1-12)
name="inferfleet/kind-node:$K8S_VERSION-$hash"
if docker image inspect "$name" >/dev/null 2>&1; then echo "$name"; exit 0; fi

log "No $official here and none to pull: assembling $name from parts"
began=$(date +%s)
cp_bin=$(INFERFLEET_CLUSTER_BIN=${INFERFLEET_CLUSTER_BIN:-} bash -c \
  'if [ -n "$INFERFLEET_CLUSTER_BIN" ]; then echo "$INFERFLEET_CLUSTER_BIN"; else bash "$0"; fi' "$root/e2e/cluster/build.sh")
node_bin=$(bash "$here/node-bins.sh")
kind_mod=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
work=$(mktemp -d "${TMPDIR:-/tmp}/inferfleet-node.XXXXXX")
builder="inferfleet-node-build-$hash"
trap 'docker rm -f "$builder" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# 1. The node's file system: packages, kind's files, binaries, CNI config.
log "(1/3) Node file system (Debian packages, kind $KIND_VERSION files, kubelet/kubeadm/kubectl $K8S_VERSION)"
ctx="$work/node"
mkdir -p "$ctx/files/usr/bin" "$ctx/files/usr/local/bin" "$ctx/files/etc/cni/net.d"
cp -r "$kind_mod/images/base/files/." "$ctx/files/"
chmod -R u+w "$ctx/files"
cp "$node_bin/kubelet" "$node_bin/kubeadm" "$cp_bin/kubectl" "$ctx/files/usr/bin/"
cp "$node_bin/crictl" "$ctx/files/usr/local/bin/"
cp "$here/node-prelude.sh" "$ctx/files/usr/local/bin/inferfleet-node-prelude"
# No kindnetd image can be pulled: one node needs only a bridge (kind's podSubnet, first /24).
cat > "$ctx/files/etc/cni/net.d/10-inferfleet-bridge.conflist" <<'JSON'
{"cniVersion": "0.4.0", "name": "inferfleet", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
cp "$root/e2e/images/kind-node.Dockerfile" "$ctx/Dockerfile"
tar -C "$ctx" -c . | DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$base" \
  --build-arg "K8S_VERSION=$K8S_VERSION" --build-arg "PAUSE_VERSION=$PAUSE_VERSION" \
  -t "$name-fs" - >/dev/null

# 2. The images kubeadm wants, under the exact names it lists, made from the same binaries.
log "(2/3) Control-plane images ($("$node_bin/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null | tr '\n' ' '))"
images=()
while read -r ref; do
  [ -n "$ref" ] || continue
  component=${ref##*/}; component=${component%%:*}
  img="$work/img-$component"; mkdir -p "$img"
  case "$component" in
    kube-apiserver|kube-controller-manager|kube-scheduler) cp "$cp_bin/$component" "$img/"; from=$base ;;
    etcd) cp "$cp_bin/etcd" "$img/"; from=$base ;;
    kube-proxy) cp "$node_bin/kube-proxy" "$img/"; from=$base ;;
    coredns) cp "$node_bin/coredns" "$img/"; from=$base ;;
    pause) cp "$node_bin/pause" "$img/"; from=scratch ;;
    *) log "kubeadm lists an image this script cannot make: $ref"; exit 1 ;;
  esac
  {
    echo "FROM $from"
    if [ "$component" = pause ]; then echo 'COPY pause /pause'; echo 'ENTRYPOINT ["/pause"]'
    elif [ "$component" = coredns ]; then echo 'COPY coredns /coredns'; echo 'ENTRYPOINT ["/coredns"]'
    else
      # kube-proxy programs the node's iptables/nftables and conntrack from inside its container.
      [ "$component" = kube-proxy ] && echo 'RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables nftables conntrack >/dev/null && rm -rf /var/lib/apt/lists/*'
      echo "COPY $component /usr/local/bin/$component"; echo 'ENTRYPOINT []'
    fi
  } > "$img/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$ref" "$img" >/dev/null
  images+=("$ref")
done < <("$node_bin/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
docker save -o "$work/images.tar" "${images[@]}"

# 3. Import them into the node's containerd (pinned, so the kubelet never collects them) and commit.
log "(3/3) Importing ${#images[@]} images into the node's containerd"
run_flags=(--privileged)
if needs_unprivileged_workaround "$name-fs"; then run_flags=("${unprivileged_run_flags[@]}"); fi
docker run -d --name "$builder" "${run_flags[@]}" -v "$work/images.tar:/images.tar:ro" \
  --entrypoint sleep "$name-fs" infinity >/dev/null
docker exec "$builder" bash -euc '
  containerd >/tmp/containerd.log 2>&1 &
  for _ in $(seq 1 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
  ctr -n k8s.io images import --all-platforms --no-unpack --digests /images.tar >/dev/null
  for ref in $(ctr -n k8s.io images ls -q); do ctr -n k8s.io images label "$ref" io.cri-containerd.pinned=pinned >/dev/null; done
  kill %1; wait || true
  rm -f /tmp/containerd.log' >&2
docker commit \
  --change 'ENTRYPOINT ["/usr/local/bin/inferfleet-node-prelude", "/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'CMD []' \
  "$builder" "$name" >/dev/null
docker rmi "$name-fs" >/dev/null 2>&1 || true
log "Assembled $name in $(( $(date +%s) - began )) s"
echo "$name"
