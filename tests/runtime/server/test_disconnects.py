"""200 concurrent streams, a fifth of whose clients leave mid-stream: the rest complete, no block leaks."""

import asyncio
import json

import httpx
import pytest
from helpers import wait_for

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
PROMPTS = [
    "Beautiful is better than",
    "Simple is better than",
    "Flat is better than",
    "Errors should never",
    "Now is better than",
]
NUM_CLIENTS = 200
MAX_TOKENS = 8
LEAVER_MAX_TOKENS = 200  # far more than a leaving client waits for: only an abort ends these early


async def stream_one(client: httpx.AsyncClient, prompt: str, leave_early: bool) -> tuple[str, str | None, bool]:
    """(text, finish reason, saw [DONE]); a leaving client closes the connection after its first text."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": LEAVER_MAX_TOKENS if leave_early else MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": leave_early,
    }
    text, reason, done = "", None, False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line:
                continue
            if line == "data: [DONE]":
                done = True
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text += choice["text"]
            reason = choice["finish_reason"] or reason
            if leave_early and text:
                break  # leaving the block closes the connection mid-stream
    return text, reason, done


@pytest.mark.slow
def test_clients_leaving_mid_stream_free_their_blocks_and_the_rest_complete(demo_model_dir):
    # A small pool (block size 4): the load also preempts, and leaks would show quickly.
    config = EngineConfig(kernels="reference", block_size=4, num_kv_blocks=160, max_num_seqs=64)
    with running_server(lambda: ModelRunner.from_model_dir(demo_model_dir, config), config, MODEL) as srv:
        want = {
            p: httpx.post(
                f"{srv.base_url}/v1/completions",
                timeout=60,
                json={"model": MODEL, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0},
            ).json()["choices"][0]["text"]
            for p in PROMPTS
        }

        async def run_all():
            limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=srv.base_url, limits=limits, timeout=120) as client:
                return await asyncio.gather(
                    *[stream_one(client, PROMPTS[i % len(PROMPTS)], i % 5 == 0) for i in range(NUM_CLIENTS)]
                )

        results = asyncio.run(run_all())
        for i, (text, reason, done) in enumerate(results):
            if i % 5 != 0:
                assert (text, reason, done) == (want[PROMPTS[i % len(PROMPTS)]], "length", True), i
        engine = srv.engine
        wait_for(lambda: engine.num_requests == 0, timeout=30, message="every request to end")
        bm = engine.block_manager
        assert engine.num_aborted_requests == NUM_CLIENTS // 5
        assert bm.num_used_blocks == 0 and all(bm.ref_count(b) == 0 for b in range(bm.num_blocks))
        idle = [
            f'inferfleet:kv_cache_usage_perc{{model_name="{MODEL}"}} 0.0',
            f'inferfleet:num_requests_running{{model_name="{MODEL}"}} 0.0',
        ]
        # The idle engine loop republishes its figures on its next turn.
        wait_for(
            lambda: all(line in httpx.get(f"{srv.base_url}/metrics").text for line in idle),
            timeout=10,
            message="the metrics to show an empty, idle engine",
        )
        assert httpx.get(f"{srv.base_url}/health").status_code == 200
        after = httpx.post(
            f"{srv.base_url}/v1/completions",
            timeout=60,
            json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0},
        )
        assert after.json()["choices"][0]["text"] == want[PROMPTS[0]]
