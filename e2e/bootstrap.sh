#!/usr/bin/env bash
# Creates (once) the project's virtual environment outside the work tree and installs the
# package with every extra; prints the environment's folder. Safe to run repeatedly.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${INFERFLEET_CACHE:-$HOME/.cache/inferfleet}
venv="$cache/venv"
mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] Creating virtual environment in $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
fi
stamp="$venv/.inferfleet-installed"
want=$(sha256sum "$root/pyproject.toml" | cut -c1-16)
# The editable install must point at this checkout (another clone may have installed itself last).
here_check="import sys, inferfleet_runtime, inferfleet_operator as o; sys.exit(not o.__file__.startswith('$root/'))"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c "$here_check" 2>/dev/null; then
  echo "[bootstrap] Installing inferfleet[runtime,operator,dev] (torch is a large download the first time)" >&2
  "$venv/bin/pip" install --quiet --progress-bar off -e "$root[runtime,operator,dev]" >&2
  echo "$want" > "$stamp"
fi
echo "$venv"
