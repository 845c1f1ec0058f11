#!/usr/bin/env bash
# Builds (or finds cached) everything the kind tier needs before any cluster exists: the Docker
# engine, the project's images, the node image and the kind binary. tests/run.sh calls it ahead of
# pytest so that the long cold builds are not counted against a test's timeout. Progress on stderr.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
began=$(date +%s)
bash "$here/docker.sh"
bash "$here/images.sh" >/dev/null
bash "$here/node-image.sh" >/dev/null
bash "$here/node-bins.sh" >/dev/null
log "kind tier artifacts ready in $(( $(date +%s) - began )) s"
