#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds the local control plane, runs every tier
# (unit, integration, kernels under the Triton interpreter, cluster e2e). Extra args go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/e2e/bootstrap.sh")
export PATH="$venv/bin:$PATH"
if [ -x "$root/e2e/cluster/build.sh" ]; then
  INFERFLEET_CLUSTER_BIN=$(bash "$root/e2e/cluster/build.sh")
  export INFERFLEET_CLUSTER_BIN
fi
# The kind tier's images, node image and kind binary, built (or found cached) ahead of pytest so
# their cold builds are not counted against a test's timeout. Where no Docker engine can run, the
# tier's tests skip and say why; any other failure shows again, with its log, in the tier's tests.
if [ -x "$root/e2e/kind/build.sh" ]; then
  bash "$root/e2e/kind/build.sh" || echo "[tests] e2e/kind/build.sh failed; the kind tier will report why" >&2
fi
cd "$root"
# This checkout's code, also in subprocesses, whichever checkout the shared venv was installed from.
export PYTHONPATH="$root/runtime:$root/operator${PYTHONPATH:+:$PYTHONPATH}"
# Lint and format (configured in pyproject.toml) before any test runs.
ruff check --no-cache .
ruff format --check --no-cache .
# The docs site (mkdocs.yml, docs/): a broken link, anchor or a page left out of the nav fails the build.
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
exec python -m pytest -ra "$@"
