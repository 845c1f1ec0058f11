"""Ask a served model one chat question through the official openai client.

    python docs/examples/openai_client.py --base-url http://127.0.0.1:8000/v1 [--question TEXT] [--wait 300]

The model is the one the server lists (GET /v1/models); --wait polls /ready first.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx
import openai


def wait_ready(base_url: str, timeout_s: float) -> None:
    root = base_url.removesuffix("/").removesuffix("/v1")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{root}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"openai_client: the server at {root} was not ready within {timeout_s:.0f} s")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="unused", help="a key, when the service requires one")
    parser.add_argument("--question", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="wait for /ready first")
    args = parser.parse_args()
    if args.wait:
        wait_ready(args.base_url, args.wait)
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    [model] = [m.id for m in client.models.list().data]
    asked = time.monotonic()
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": args.question}],
        max_tokens=args.max_tokens,
        temperature=0,
    )
    print(f"model:     {model}")
    print(f"user:      {args.question}")
    print(f"assistant: {reply.choices[0].message.content}")
    print(f"usage:     {reply.usage.prompt_tokens} prompt + {reply.usage.completion_tokens} completion tokens")
    print(f"time:      {time.monotonic() - asked:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
