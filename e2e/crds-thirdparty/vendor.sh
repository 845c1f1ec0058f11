#!/usr/bin/env bash
# Refreshes the vendored Gateway API Inference Extension InferencePool CRD from the Go module proxy.
# The version is pinned here and in operator/inferfleet_operator/plan/routing.py (the API version it writes).
set -euo pipefail
VERSION="${1:-v1.6.0}"
here="$(cd "$(dirname "$0")" && pwd)"
dir="$(go mod download -json "sigs.k8s.io/gateway-api-inference-extension@${VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
{
  echo "# Vendored from the Go module sigs.k8s.io/gateway-api-inference-extension@${VERSION} (Go module proxy),"
  echo "# file config/crd/bases/inference.networking.k8s.io_inferencepools.yaml, unchanged below. Used by tests only;"
  echo "# refresh with e2e/crds-thirdparty/vendor.sh."
  cat "${dir}/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
} > "${here}/inferencepools.inference.networking.k8s.io.yaml"
echo "Wrote ${here}/inferencepools.inference.networking.k8s.io.yaml (${VERSION})"
