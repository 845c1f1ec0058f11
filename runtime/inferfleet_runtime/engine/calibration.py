"""Measuring an engine's pool profile, the service rates the router routes a pool by: prefill tokens/s against
prompt length, decode tokens/s against batch size, and the batch and KV limits (the router's PoolProfile fields).
`inferfleet-runtime profile` (bench/pool_profile.py) measures it offline; `serve --calibrate` on its own engine
before it is ready (calibrate_engine).

Prefill: each prompt length runs alone with max_tokens=1, a warm-up first, then the repeats; the rate is the prompt
tokens computed over the wall time from admission to the one output token. Every prompt is new random token ids, so
the prefix cache serves none of it. Decode: a batch of sequences with short prompts is prefilled and decoded
WARMUP_STEPS steps, then timed over windows of a number of steps; the rate is the output tokens of the whole batch
over the windows' wall time.

Both are sustained rates: each point is measured again (new prompts, a new batch) until its timed runs add up to
MIN_TIMED_SECONDS at least, and the rate is all the tokens over all that time. A container's CPU quota is enforced
per scheduler period (100 ms by default): windows of a few milliseconds run at the whole machine's speed between
pauses, so a node limited to a quarter core would look as fast as an unlimited one in a median of short windows.
"""

from __future__ import annotations

import math
import random
import sys
import time

DECODE_PROMPT_LENGTH = 32  # tokens of each decoding sequence's prompt
WARMUP_STEPS = 2  # decode steps at each batch size before the timed windows
FIRST_TOKEN_ID = 16  # random prompts draw ids from here up, clear of the usual special tokens
SIGNIFICANT_DIGITS = 4  # of the rates written
MIN_TIMED_SECONDS = 0.3  # each point's timed runs add up to this at least: three CPU-quota periods
MAX_ROUNDS = 200  # of a point's runs, whatever their time (a very fast engine stops here)
# serve --calibrate: a few points, few repeats, so a server on a GPU is ready seconds later (every point that fits)
CALIBRATION_PROMPT_LENGTHS = (16, 128)
CALIBRATION_BATCH_SIZES = (1, 4)
CALIBRATION_STEPS = 8
CALIBRATION_REPEATS = 2


def calibrate_engine(engine) -> dict | None:
    """The profile `serve --calibrate` measures before the server is ready, on its own engine, at the calibration
    points that fit it; None (logged) when none fits or the engine cannot be measured: serving goes on without."""
    context = engine.max_context_length
    lengths = [n for n in CALIBRATION_PROMPT_LENGTHS if n + 1 <= context]
    batches = [b for b in CALIBRATION_BATCH_SIZES if b <= engine.config.max_num_seqs]
    problem = "no calibration point fits the engine's context and batch" if not lengths or not batches else None
    if problem is None:
        problem = check_fits(engine, lengths, batches, CALIBRATION_STEPS, CALIBRATION_REPEATS)
    if problem is not None:
        progress(f"Not calibrated: {problem}")
        return None
    started = time.perf_counter()
    try:
        profile = measure(engine, lengths, batches, CALIBRATION_STEPS, CALIBRATION_REPEATS)
    except Exception as exc:  # a measurement must never stop the server from serving
        progress(f"Not calibrated: {type(exc).__name__}: {exc}")
        return None
    progress(f"Calibrated the engine's profile in {time.perf_counter() - started:.1f} s")
    return profile


def check_fits(engine, prompt_lengths: list[int], batch_sizes: list[int], num_steps: int, num_repeats: int):
    """Why the points cannot be measured on this engine (one line), or None: every prompt and one output token fit
    the context, and every decode batch fits the KV pool at once, so nothing is preempted mid-measurement."""
    context = engine.max_context_length
    longest = max(prompt_lengths)
    if longest + 1 > context:
        return (
            f"--prompt-lengths: a prompt of {longest} tokens leaves no room for an output token in the context of "
            f"{context} tokens (the model's, --max-context-length or the KV pool)"
        )
    num_tokens = _decode_length(num_steps, num_repeats)
    if num_tokens > context:
        return (
            f"--decode-steps: a decoding sequence grows to {num_tokens} tokens, past the context of {context} tokens; "
            "lower --decode-steps or --repeats"
        )
    bm = engine.block_manager
    batch = max(batch_sizes)
    num_blocks = batch * bm.num_blocks_for(num_tokens)
    if num_blocks > bm.num_blocks:
        return (
            f"--batch-sizes: {batch} sequences of {num_tokens} tokens need {num_blocks} KV blocks, the pool holds "
            f"{bm.num_blocks}; lower the batch or --decode-steps, or give the pool more (--kv-cache-memory)"
        )
    return None


def measure(engine, prompt_lengths: list[int], batch_sizes: list[int], num_steps: int, num_repeats: int) -> dict:
    """The profile of the engine: the router's PoolProfile fields as JSON values."""
    rng = random.Random(0)
    prefill = []
    for length in sorted(set(prompt_lengths)):
        rate = prefill_rate(engine, length, num_repeats, rng)
        progress(f"Measured prefill of {length} tokens: {rate:.1f} tokens/s (sustained)")
        prefill.append([length, _rounded(rate)])
    decode = []
    for batch in sorted(set(batch_sizes)):
        rate = decode_rate(engine, batch, num_steps, num_repeats, rng)
        progress(f"Measured decode at batch {batch}: {rate:.1f} tokens/s (sustained, windows of {num_steps} steps)")
        decode.append([batch, _rounded(rate)])
    bm = engine.block_manager
    return {
        "prefill": prefill,
        "decode": decode,
        "max_batch": engine.config.max_num_seqs,
        "kv_capacity_tokens": bm.num_blocks * bm.block_size,
        "block_size": bm.block_size,
        "has_prefix_cache": bm.enable_prefix_caching,
    }


def prefill_rate(engine, num_tokens: int, num_repeats: int, rng: random.Random) -> float:
    """Prompt tokens computed per second for a prompt of num_tokens run alone, after one warm-up run: over at least
    num_repeats runs and MIN_TIMED_SECONDS of them."""
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    total_tokens, total_seconds = 0, 0.0
    for attempt in range(MAX_ROUNDS + 1):
        request_id = _request_id(rng)
        started = time.perf_counter()
        engine.add_request(request_id, _prompt(engine, num_tokens, rng), params)
        num_computed = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                num_computed = out.num_prompt_tokens - out.num_cached_tokens
        if attempt > 0:
            total_tokens += num_computed
            total_seconds += time.perf_counter() - started
            if attempt >= num_repeats and total_seconds >= MIN_TIMED_SECONDS:
                break
    return total_tokens / total_seconds


def decode_rate(engine, batch: int, num_steps: int, num_repeats: int, rng: random.Random) -> float:
    """Output tokens per second summed over `batch` sequences decoding together, over windows of num_steps: a new
    batch each round, until the windows add up to MIN_TIMED_SECONDS."""
    total_tokens, total_seconds = 0, 0.0
    for _ in range(MAX_ROUNDS):
        tokens, seconds = _decode_round(engine, batch, num_steps, num_repeats, rng)
        total_tokens, total_seconds = total_tokens + tokens, total_seconds + seconds
        if total_seconds >= MIN_TIMED_SECONDS:
            break
    return total_tokens / total_seconds


def _decode_round(engine, batch: int, num_steps: int, num_repeats: int, rng: random.Random) -> tuple[int, float]:
    """One batch decoded: the output tokens of its num_repeats timed windows and their wall time."""
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    num_output_tokens = _decode_length(num_steps, num_repeats) - DECODE_PROMPT_LENGTH
    params = SamplingParams(temperature=0, max_tokens=num_output_tokens, ignore_eos=True)
    request_ids = [_request_id(rng) for _ in range(batch)]
    for request_id in request_ids:
        engine.add_request(request_id, _prompt(engine, DECODE_PROMPT_LENGTH, rng), params)
    scheduler = engine.scheduler
    try:
        while scheduler.num_waiting or any(s.num_computed_tokens < len(s.prompt_token_ids) for s in scheduler.running):
            engine.step()
        for _ in range(WARMUP_STEPS):
            engine.step()
        num_tokens, seconds = 0, 0.0
        for _ in range(num_repeats):
            started = time.perf_counter()
            for _ in range(num_steps):
                num_tokens += sum(len(c.token_ids) for out in engine.step() for c in out.outputs)
            seconds += time.perf_counter() - started
    finally:
        for request_id in request_ids:  # the last window ends them; an error leaves none behind either
            engine.abort_request(request_id)
    return num_tokens, seconds


def _decode_length(num_steps: int, num_repeats: int) -> int:
    """Tokens a decoding sequence holds at the end: its prompt, the prefill's token, warm-up and timed steps."""
    return DECODE_PROMPT_LENGTH + 1 + WARMUP_STEPS + num_steps * num_repeats


def _prompt(engine, num_tokens: int, rng: random.Random) -> list[int]:
    vocab = engine.runner.vocab_size
    low = min(FIRST_TOKEN_ID, vocab - 1)
    return [rng.randrange(low, vocab) for _ in range(num_tokens)]


def _request_id(rng: random.Random) -> str:
    return f"profile-{rng.getrandbits(64):016x}"


def _rounded(rate: float) -> float:
    assert math.isfinite(rate) and rate > 0, rate  # a step takes time and every point computes tokens
    return float(f"{rate:.{SIGNIFICANT_DIGITS}g}")


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
