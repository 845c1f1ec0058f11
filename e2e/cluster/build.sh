#!/usr/bin/env bash
# Builds the pinned control-plane binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok, kwokctl, helm) from the Go module proxy into a cache outside
# the work tree, with version stamps, and prints the binary folder on stdout (nothing else goes to
# stdout; progress goes to stderr). Rebuilds only when pins.env changes; finished binaries of an
# interrupted build are kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=pins.env
source "$here/pins.env"
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}
pin_hash=$(sha256sum "$here/pins.env" | cut -c1-12)
bin="$cache/cluster-bin/$pin_hash"
kube_tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
tools=("${kube_tools[@]}" etcd kwok kwokctl helm)

# helm's default Kubernetes version (what `helm template` assumes without --kube-version) is stamped
# at build time; a marker records it, so a helm cached before the stamp existed is rebuilt alone
# (the other binaries, keyed by the hash of pins.env, are kept).
helm_marker="$bin/helm.kube-version"
helm_built() { [ -x "$bin/helm" ] && [ -s "$helm_marker" ]; }
all_built() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; helm_built; }
if all_built; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "[build] Go is needed to build the local control plane (see README)" >&2; exit 1; }
mkdir -p "$bin" "$cache/go-work"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[build] $*" >&2; }
todo=0; for t in "${tools[@]}"; do [ -x "$bin/$t" ] || todo=$((todo + 1)); done
[ -x "$bin/helm" ] && ! helm_built && todo=$((todo + 1))
step=0
progress() { step=$((step + 1)); log "($step/$todo) Building $*"; }
began=$(date +%s)
log "Building $todo binaries into $bin (Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION)"

# shellcheck source=kube-wrapper.sh
source "$here/kube-wrapper.sh"
build_kubernetes() {
  local dir="$cache/go-work/kubernetes-$K8S_VERSION" ld
  kube_wrapper_module "$dir" "$K8S_VERSION" "${kube_tools[@]}"
  ld=$(kube_version_ldflags "$K8S_VERSION")
  for t in "${kube_tools[@]}"; do
    [ -x "$bin/$t" ] && continue
    progress "$t $K8S_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "-s -w $ld" -o "$bin/$t.tmp" "k8s.io/kubernetes/cmd/$t" >&2)
    mv "$bin/$t.tmp" "$bin/$t"
  done
}

# go.etcd.io/etcd/server/v3 is package main but its go.mod has replace directives, so it cannot be
# `go install`ed; a wrapper module requiring it at the release tag builds it.
build_etcd() {
  local dir="$cache/go-work/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  printf 'module inferfleet.local/etcd-wrapper\ngo 1.26\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$dir/tools.go"
  (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && { go mod tidy >&2 || true; })
  progress "etcd $ETCD_VERSION"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 >&2)
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_go_installable() {
  local name=$1 module=$2 version=$3 ldflags=${4:-}
  progress "$name $version"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w $ldflags" "$module@$version" >&2
}

[ -x "$bin/etcd" ] || build_etcd
[ -x "$bin/kwok" ] || build_go_installable kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
[ -x "$bin/kwokctl" ] || build_go_installable kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
# As helm's Makefile does: the default Kubernetes version is 1.<minor of the client-go helm requires>.
build_helm() {
  local gomod client_go minor stamp
  gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  client_go=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")
  [ -n "$client_go" ] || { log "Found no k8s.io/client-go in $gomod"; return 1; }
  minor=$(echo "$client_go" | cut -d. -f2)
  stamp="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    stamp+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  build_go_installable helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "$stamp"
  echo "v1.$minor.0" > "$helm_marker"
}
helm_built || build_helm
all_built || build_kubernetes

# Every binary must report the pinned version, or the build is wrong (e.g. stamps not applied).
check_version() {
  local want=$1; shift
  local got
  # awk reads to the end: `head` would close the pipe early and, under pipefail, a binary that prints
  # more than three lines (etcd prints four) could die of SIGPIPE and fail the build (exit 141).
  got=$("$@" 2>&1 | awk 'NR <= 3' | tr '\n' ' ')
  case "$got" in
    *"$want"*) log "  $(basename "$1"): $got" ;;
    *) log "$(basename "$1") reports '$got', expected $want"; return 1 ;;
  esac
}
check_version "$K8S_VERSION" "$bin/kube-apiserver" --version
check_version "$K8S_VERSION" "$bin/kube-controller-manager" --version
check_version "$K8S_VERSION" "$bin/kube-scheduler" --version
check_version "$K8S_VERSION" "$bin/kubectl" version --client
check_version "${ETCD_VERSION#v}" "$bin/etcd" --version
check_version "$KWOK_VERSION" "$bin/kwok" --version
check_version "$KWOK_VERSION" "$bin/kwokctl" --version
check_version "$HELM_VERSION" "$bin/helm" version
log "  helm default Kubernetes version: $(cat "$helm_marker")"
log "Built in $(( $(date +%s) - began )) s"
echo "$bin"
