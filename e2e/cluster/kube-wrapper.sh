# Sourced by build.sh and e2e/kind/node-bins.sh: how Kubernetes commands are built from the Go module
# proxy. Kubernetes' go.mod maps its staging modules (k8s.io/api, k8s.io/client-go, ...) to
# ./staging at v0.0.0, so a wrapper module requires k8s.io/kubernetes and replaces each with its
# published v0.N.P.

# kube_wrapper_module DIR VERSION CMD...: writes (and resolves) the wrapper module in DIR for the
# given k8s.io/kubernetes/cmd/ commands.
kube_wrapper_module() {
  local dir=$1 version=$2; shift 2
  local minor=${version#v1.} staging gomod t
  mkdir -p "$dir"
  gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging=$(grep -E '=> \./staging/' "$gomod" | awk '{print $1}')
  [ -n "$staging" ] || { echo "[build] Found no staging replaces in $gomod" >&2; return 1; }
  {
    echo "module inferfleet.local/kubernetes-wrapper"
    echo "go 1.26"
    echo "require k8s.io/kubernetes $version"
    for m in $staging; do echo "replace $m => $m v0.$minor"; done
  } > "$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n' > "$dir/tools.go"
  for t in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$t" >> "$dir/tools.go"; done
  printf ')\n' >> "$dir/tools.go"
  (cd "$dir" && { go mod tidy -e >&2 2>/dev/null || true; } && go get "k8s.io/kubernetes@$version" >&2)
}

# kube_version_ldflags VERSION: version stamps as upstream's hack/lib/version.sh sets them;
# unstamped binaries report v0.0.0-master, which breaks version checks in kubectl, kwokctl and helm.
kube_version_ldflags() {
  local version=$1 minor=${1#v1.} ld="" date pkg
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor%%.*}"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$ld"
}
