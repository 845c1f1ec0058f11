"""Streaming requests to an OpenAI-compatible server and the timed run of a whole benchmark (httpx, asyncio)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from .datasets import SampleRequest


@dataclass
class RequestResult:
    prompt_len: int
    expected_output_len: int
    success: bool = False
    output_len: int = 0  # completion tokens (the server's usage, else content chunks)
    ttft: float = 0.0  # seconds from send to the first content chunk
    latency: float = 0.0  # seconds from send to the end of the stream (E2EL)
    itl: list[float] = field(default_factory=list)  # seconds between successive content chunks
    start: float = 0.0  # seconds since the benchmark started
    error: str = ""


def bearer(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def base_url(url: str) -> str:
    """http://host:port, http://host:port/ or http://host:port/v1 -> http://host:port/v1."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


async def served_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model id the server lists."""
    response = await client.get(f"{base_url(url)}/models")
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise RuntimeError(f"{url} serves no model")
    return models[0]["id"]


async def send_completion(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    sample: SampleRequest,
    ignore_eos: bool,
    temperature: float,
    started_at: float,
) -> RequestResult:
    result = RequestResult(sample.prompt_len, sample.expected_output_len)
    body = {
        "model": model,
        "prompt": sample.prompt,
        "max_tokens": sample.expected_output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True  # a vLLM extension; servers without it generally ignore unknown fields
    sent = time.perf_counter()
    result.start = sent - started_at
    last = sent
    num_chunks = 0
    usage_tokens = None
    try:
        async with client.stream("POST", f"{base_url(url)}/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    result.error = str(chunk["error"])[:200]
                    return result
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    now = time.perf_counter()
                    if num_chunks == 0:
                        result.ttft = now - sent
                    else:
                        result.itl.append(now - last)
                    last = now
                    num_chunks += 1
        result.latency = time.perf_counter() - sent
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
        return result
    result.output_len = usage_tokens if usage_tokens is not None else num_chunks
    result.success = num_chunks > 0
    if not result.success:
        result.error = "the stream ended without content"
    return result


async def run_requests(
    url: str,
    model: str,
    samples: list[SampleRequest],
    offsets: list[float],
    max_concurrency: int | None,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    timeout: float = 600.0,
    progress=None,
    api_key: str | None = None,
) -> tuple[list[RequestResult], float]:
    """Sends samples[i] at offsets[i] seconds (waiting for a free slot when max_concurrency is reached);
    returns the results in sample order and the benchmark's wall seconds. With api_key, every request carries
    `Authorization: Bearer <api_key>`."""
    limit = max_concurrency or len(samples) or 1
    semaphore = asyncio.Semaphore(limit)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    headers = bearer(api_key)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits, headers=headers) as client:
        started_at = time.perf_counter()

        async def one(sample: SampleRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, started_at + offset - time.perf_counter()))
            async with semaphore:
                result = await send_completion(client, url, model, sample, ignore_eos, temperature, started_at)
            if progress is not None:
                progress.update(1)
            return result

        results = await asyncio.gather(*(one(s, o) for s, o in zip(samples, offsets)))
        return list(results), time.perf_counter() - started_at
