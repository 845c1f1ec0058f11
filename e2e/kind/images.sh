#!/usr/bin/env bash
# Builds the project's images with the local Docker engine, each tagged by the hash of its inputs
# (Dockerfile, base image, pyproject.toml, runtime/, operator/) and built only when no
# image of that tag exists. Also tags each with the chart's appVersion, so the chart's default
# image names resolve to these builds. Prints one "NAME=IMAGE:TAG" line per image on stdout.
#   images.sh [runtime] [operator]      (default: both)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/e2e/kind"
log() { echo "[images] $*" >&2; }
bash "$here/docker.sh"
base=$(bash "$here/base-image.sh")
base_id=$(docker image inspect -f '{{.Id}}' "$base")
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/inferfleet/Chart.yaml")
inputs=(pyproject.toml runtime operator e2e/images)
# The host's CA bundle goes into the build context (not into the hash): pip in the build stage
# trusts what the host trusts, which matters behind a TLS-inspecting proxy.
ca_dir=$(mktemp -d "${TMPDIR:-/tmp}/inferfleet-images.XXXXXX")
trap 'rm -rf "$ca_dir"' EXIT
ca_file=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
if [ -s "$ca_file" ]; then cp "$ca_file" "$ca_dir/build-ca.crt"; else : > "$ca_dir/build-ca.crt"; fi
# pyproject.toml names README.md as the package's long description; a stub stands in for it, so
# editing the README neither rebuilds nor changes an image.
echo "inferfleet: see the project's README.md" > "$ca_dir/README.md"
# Each image's dependencies (the project's own plus its extra) as a requirements file: the Dockerfiles install
# them in a layer of their own, so editing another part of pyproject.toml (the dev extra, tool settings) keeps
# that layer (torch alone is several GB) and rebuilds only the project's wheel above it.
for extra in runtime operator; do
  python3 -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"][sys.argv[2]]))' "$root/pyproject.toml" "$extra" \
    > "$ca_dir/requirements-$extra.txt"
done

# sha256 over every input file's path and content (caches and bytecode left out).
inputs_hash() {
  (cd "$root" && find "${inputs[@]}" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum)
}

build() {
  local kind=$1 repo=$2 hash tag began
  hash=$( { inputs_hash; echo "$base_id"; echo "${INFERFLEET_TORCH_INDEX_URL:-}"; } | sha256sum | cut -c1-12)
  tag="$repo:$hash"
  if docker image inspect "$tag" >/dev/null 2>&1; then
    log "Reused $tag"
  else
    log "Building $tag from e2e/images/$kind.Dockerfile (base $base; the runtime's torch is a large download the first time)"
    began=$(date +%s)
    (cd "$root" && tar -c --exclude=__pycache__ --exclude='*.pyc' "${inputs[@]}" -C "$ca_dir" README.md build-ca.crt "requirements-$kind.txt") |
      DOCKER_BUILDKIT=0 docker build -q -f "e2e/images/$kind.Dockerfile" --build-arg "BASE_IMAGE=$base" \
        --build-arg "TORCH_INDEX_URL=${INFERFLEET_TORCH_INDEX_URL:-}" --build-arg CPU_ONLY=1 \
        --label "dev.inferfleet.inputs=$hash" -t "$tag" - >&2
    log "Built $tag in $(( $(date +%s) - began )) s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1 / 1e9}'))"
    # Earlier builds of this image (other input hashes) are left behind by every change: a runtime image is
    # 5.2 GB, so they are removed (a kind node keeps its own copy of what it loaded; a tag still in use stays).
    docker images "$repo" --format '{{.Tag}}' | while read -r old; do
      if [ "$old" != "$hash" ] && [ "$old" != "$app_version" ] && docker rmi "$repo:$old" >/dev/null 2>&1; then
        log "Removed the earlier build $repo:$old"
      fi
    done
    docker image prune -f >/dev/null 2>&1 || true
  fi
  docker tag "$tag" "$repo:$app_version"
  echo "$kind=$tag"
}

kinds=("$@"); [ ${#kinds[@]} -gt 0 ] || kinds=(runtime operator)
for kind in "${kinds[@]}"; do
  case "$kind" in
    runtime) build runtime inferfleet/runtime-cpu ;;
    operator) build operator inferfleet/operator ;;
    *) log "Unknown image '$kind' (runtime or operator)"; exit 2 ;;
  esac
done
