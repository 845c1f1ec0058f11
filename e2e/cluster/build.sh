#!/usr/bin/env bash
# Builds the pinned control-plane binaries from the Go module proxy into a cache outside the
# work tree; prints the binary folder. Rebuilds only when pins.env changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=pins.env
source "$here/pins.env"
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}
pin_hash=$(sha256sum "$here/pins.env" | cut -c1-12)
bin="$cache/cluster-bin/$pin_hash"
tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl helm)

all_built() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
if all_built; then echo "$bin"; exit 0; fi

mkdir -p "$bin" "$cache/go-work"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "[build] $*" >&2; }
step=0; total=5
progress() { step=$((step + 1)); log "($step/$total) $*"; }

build_kubernetes() {
  local dir="$cache/go-work/kubernetes-$K8S_VERSION" minor staging
  minor=${K8S_VERSION#v1.}
  mkdir -p "$dir"
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  staging=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs grep -E '=> ./staging' | awk '{print $1}')
  {
    echo "module inferfleet.local/kubernetes-wrapper"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    for m in $staging; do echo "replace $m => $m v0.$minor"; done
  } > "$dir/go.mod"
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  local major=1 minor_num=${minor%%.*} date ld=""
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor_num"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || true
   cd "$dir" && go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
  for t in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    progress "Building $t $K8S_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "-s -w $ld" -o "$bin/$t" "k8s.io/kubernetes/cmd/$t")
  done
}

build_etcd() {
  local dir="$cache/go-work/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  printf 'module inferfleet.local/etcd-wrapper\ngo 1.26\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$dir/tools.go"
  (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 || true)
  log "Building etcd $ETCD_VERSION"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
}

build_go_installable() {
  local name=$1 module=$2 version=$3 ldflags=${4:-}
  log "Building $name $version"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w $ldflags" "$module@$version"
}

total=7
[ -x "$bin/etcd" ] || { progress "etcd"; build_etcd; }
[ -x "$bin/kwok" ] || { progress "kwok"; build_go_installable kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"; }
[ -x "$bin/kwokctl" ] || { progress "kwokctl"; build_go_installable kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"; }
[ -x "$bin/helm" ] || { progress "helm"; build_go_installable helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"; }
all_built || build_kubernetes
all_built
echo "$bin"
