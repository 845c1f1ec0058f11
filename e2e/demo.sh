#!/usr/bin/env bash
# The demo: installs what it needs, makes the built-in model, serves it with the paged runtime on
# loopback and answers one chat completion through the official openai client.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(bash "$root/e2e/bootstrap.sh")
export PATH="$venv/bin:$PATH"
port=${INFERFLEET_DEMO_PORT:-8765}
model_dir=$(mktemp -d)/inferfleet-demo
echo "[demo] Making the built-in model (trained once, then cached)" >&2
inferfleet-runtime demo-model --out "$model_dir" >&2
echo "[demo] Starting inferfleet-runtime serve on 127.0.0.1:$port" >&2
inferfleet-runtime serve --model "$model_dir" --host 127.0.0.1 --port "$port" >"$model_dir.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
python - "$port" <<'PY'
import sys, time, httpx, openai
port = sys.argv[1]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 120
while True:
    try:
        if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit("The server did not become ready within 120 s")
    time.sleep(0.5)
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
question = "Complete the line: Beautiful is"
reply = client.chat.completions.create(
    model="inferfleet-demo",
    messages=[{"role": "user", "content": question}],
    max_tokens=24,
    temperature=0,
)
print(f"user:      {question}")
print(f"assistant: {reply.choices[0].message.content}")
print(f"usage:     {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens")
PY
