#!/usr/bin/env bash
# Builds what a kind node needs beyond the control-plane binaries (e2e/cluster/build.sh): kubelet,
# kubeadm and kube-proxy at the same pinned Kubernetes version and from the same wrapper-module
# approach, coredns, crictl, kind itself and the pause program, into a cache folder keyed by both
# pins files. Prints the folder on stdout; progress on stderr. Rebuilds only what is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../cluster/pins.env
source "$root/e2e/cluster/pins.env"
# shellcheck source=pins.env
source "$root/e2e/kind/pins.env"
# shellcheck source=../cluster/kube-wrapper.sh
source "$root/e2e/cluster/kube-wrapper.sh"
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}
pin_hash=$(cat "$root/e2e/cluster/pins.env" "$root/e2e/kind/pins.env" | sha256sum | cut -c1-12)
bin="$cache/kind-bin/$pin_hash"
kube_tools=(kubelet kubeadm kube-proxy)
tools=("${kube_tools[@]}" coredns crictl kind pause)
log() { echo "[kind-bin] $*" >&2; }

all_built() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
if all_built; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { log "Go is needed to build the kind node's binaries (see README)"; exit 1; }
mkdir -p "$bin" "$cache/go-work"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
began=$(date +%s)
log "Building into $bin (Kubernetes $K8S_VERSION, kind $KIND_VERSION, coredns $COREDNS_VERSION, crictl $CRICTL_VERSION)"

if [ ! -x "$bin/pause" ]; then
  log "Building pause $PAUSE_VERSION (gcc -static, from k8s.io/kubernetes build/pause)"
  k8s_dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$bin/pause.tmp" "$k8s_dir/build/pause/linux/pause.c"
  mv "$bin/pause.tmp" "$bin/pause"
fi
install_tool() {
  local name=$1 module=$2 version=$3 ldflags=${4:-}
  [ -x "$bin/$name" ] && return 0
  log "Building $name $version"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w $ldflags" "$module@$version" >&2
}
install_tool kind sigs.k8s.io/kind "$KIND_VERSION"
install_tool crictl sigs.k8s.io/cri-tools/cmd/crictl "$CRICTL_VERSION" "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
install_tool coredns github.com/coredns/coredns "$COREDNS_VERSION"
# Its own wrapper folder (not build.sh's), so the two scripts never rewrite each other's go.mod;
# the Go build cache is shared, so packages compiled for the control plane are reused.
missing=(); for t in "${kube_tools[@]}"; do [ -x "$bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
  dir="$cache/go-work/kubernetes-node-$K8S_VERSION"
  kube_wrapper_module "$dir" "$K8S_VERSION" "${kube_tools[@]}"
  ld=$(kube_version_ldflags "$K8S_VERSION")
  for t in "${missing[@]}"; do
    log "Building $t $K8S_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "-s -w $ld" -o "$bin/$t.tmp" "k8s.io/kubernetes/cmd/$t" >&2)
    mv "$bin/$t.tmp" "$bin/$t"
  done
fi
"$bin/kubelet" --version 2>&1 | grep -qF "$K8S_VERSION" || { log "kubelet does not report $K8S_VERSION"; exit 1; }
log "Built in $(( $(date +%s) - began )) s"
echo "$bin"
