#!/usr/bin/env bash
# Deletes this work tree's kind cluster (the one up.sh made) and its state folder. Leaves the images
# and the Docker engine alone.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
node_bin=$(bash "$here/node-bins.sh")
if has_kind_cluster "$node_bin/kind" "$cluster"; then
  "$node_bin/kind" delete cluster --name "$cluster" >&2
fi
rm -rf "$state"
