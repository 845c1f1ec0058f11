"""`inferfleet-runtime profile`: measures, offline on the paged engine, the service rates the router routes a pool by
(prefill tokens/s against prompt length, decode tokens/s against batch size, the batch and KV limits) and writes them
in the router's --profile-file shape, under one pool's name.

Prefill: each prompt length runs alone with max_tokens=1, a warm-up first, then `--repeats` runs; the rate is the
prompt tokens computed over the wall time from admission to the one output token, median over the runs. Every prompt
is new random token ids, so the prefix cache serves none of it. Decode: a batch of sequences with short prompts is
prefilled and decoded WARMUP_STEPS steps, then timed over `--repeats` windows of `--decode-steps` steps; the rate is
the output tokens of the whole batch over a window's wall time, median over the windows.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from inferfleet_runtime.server.cli import add_engine_arguments, check_paged_model, config_from_args
from inferfleet_runtime.termination import fail

DEFAULT_POOL = "default"  # the router's pool of endpoints given without one
DECODE_PROMPT_LENGTH = 32  # tokens of each decoding sequence's prompt
WARMUP_STEPS = 2  # decode steps at each batch size before the timed windows
FIRST_TOKEN_ID = 16  # random prompts draw ids from here up, clear of the usual special tokens
SIGNIFICANT_DIGITS = 4  # of the rates written
# serve --calibrate: a few points, few repeats, so a server on a GPU is ready seconds later (every point that fits)
CALIBRATION_PROMPT_LENGTHS = (16, 128)
CALIBRATION_BATCH_SIZES = (1, 4)
CALIBRATION_STEPS = 8
CALIBRATION_REPEATS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", required=True, help="Hugging Face checkpoint directory, or a .gguf")
    parser.add_argument("--out", metavar="FILE", default=None, help="write the profile JSON here (default: stdout)")
    parser.add_argument(
        "--pool",
        default=DEFAULT_POOL,
        help="the pool the profile is filed under, as in the router's --endpoint URL,pool=NAME (default: default, "
        "the router's pool of endpoints given without one)",
    )
    parser.add_argument(
        "--prompt-lengths",
        default="16,128,512",
        metavar="N,N,...",
        help="prompt lengths whose prefill rate is measured",
    )
    parser.add_argument(
        "--batch-sizes", default="1,4,16", metavar="N,N,...", help="batch sizes whose decode rate is measured"
    )
    parser.add_argument("--decode-steps", type=int, default=32, metavar="N", help="decode steps in one timed window")
    parser.add_argument("--repeats", type=int, default=5, metavar="N", help="timed runs (or windows) per point")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        prompt_lengths = _positive_ints(args.prompt_lengths, "--prompt-lengths")
        batch_sizes = _positive_ints(args.batch_sizes, "--batch-sizes")
        for flag, value in (("--decode-steps", args.decode_steps), ("--repeats", args.repeats)):
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        config = config_from_args(args)
        check_paged_model(Path(args.model), config)
    except ValueError as exc:
        return _fail(str(exc))
    if max(batch_sizes) > config.max_num_seqs:
        return _fail(
            f"--batch-sizes: a batch of {max(batch_sizes)} exceeds the engine's {config.max_num_seqs} sequences "
            "(--max-num-seqs)"
        )

    import torch

    from inferfleet_runtime.device import cpu_engine_threads
    from inferfleet_runtime.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_model_dir(args.model, config)
    runner = engine.runner
    num_threads = torch.get_num_threads()
    if runner.device.type == "cpu":  # as the server's engine thread runs it; tensor-parallel ranks share the cores
        tp = runner.tensor_parallel
        torch.set_num_threads(max(1, cpu_engine_threads() // (tp.world if tp else 1)))
    try:
        problem = check_fits(engine, prompt_lengths, batch_sizes, args.decode_steps, args.repeats)
        if problem is not None:
            return _fail(problem)
        _progress(
            f"Loaded {args.model} on {runner.device}: kernels {runner.ops.backend}, "
            f"{engine.block_manager.num_blocks} KV blocks of {config.block_size} tokens, batch up to "
            f"{config.max_num_seqs}, context {engine.max_context_length} tokens"
        )
        profile = measure(engine, prompt_lengths, batch_sizes, args.decode_steps, args.repeats)
    finally:
        torch.set_num_threads(num_threads)
        if runner.workers is not None:
            runner.workers.stop()
    text = profile_json(args.pool, profile)
    if args.out:
        try:
            Path(args.out).write_text(text)
        except OSError as exc:
            return _fail(f"cannot write {args.out}: {exc.strerror or exc}")
        _progress(f"Wrote the profile of pool {args.pool!r} to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


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
        _progress(f"Not calibrated: {problem}")
        return None
    started = time.perf_counter()
    try:
        profile = measure(engine, lengths, batches, CALIBRATION_STEPS, CALIBRATION_REPEATS)
    except Exception as exc:  # a measurement must never stop the server from serving
        _progress(f"Not calibrated: {type(exc).__name__}: {exc}")
        return None
    _progress(f"Calibrated the engine's profile in {time.perf_counter() - started:.1f} s")
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
        _progress(f"Measured prefill of {length} tokens: {rate:.1f} tokens/s (median of {num_repeats})")
        prefill.append([length, _rounded(rate)])
    decode = []
    for batch in sorted(set(batch_sizes)):
        rate = decode_rate(engine, batch, num_steps, num_repeats, rng)
        _progress(
            f"Measured decode at batch {batch}: {rate:.1f} tokens/s (median of {num_repeats} windows of {num_steps} "
            "steps)"
        )
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
    """Median prompt tokens computed per second for a prompt of num_tokens run alone, after one warm-up run."""
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rates = []
    for attempt in range(num_repeats + 1):
        request_id = _request_id(rng)
        started = time.perf_counter()
        engine.add_request(request_id, _prompt(engine, num_tokens, rng), params)
        num_computed = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                num_computed = out.num_prompt_tokens - out.num_cached_tokens
        if attempt > 0:
            rates.append(num_computed / (time.perf_counter() - started))
    return statistics.median(rates)


def decode_rate(engine, batch: int, num_steps: int, num_repeats: int, rng: random.Random) -> float:
    """Median output tokens per second summed over `batch` sequences decoding together, over windows of num_steps."""
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
        rates = []
        for _ in range(num_repeats):
            started = time.perf_counter()
            num_tokens = 0
            for _ in range(num_steps):
                num_tokens += sum(len(c.token_ids) for out in engine.step() for c in out.outputs)
            rates.append(num_tokens / (time.perf_counter() - started))
    finally:
        for request_id in request_ids:  # the last window ends them; an error leaves none behind either
            engine.abort_request(request_id)
    return statistics.median(rates)


def profile_json(pool: str, profile: dict) -> str:
    """{pool: profile} as the router's --profile-file reads it, a field a line (pool files merge with `jq -s add`)."""
    fields = ",\n".join(f"    {json.dumps(key)}: {json.dumps(value)}" for key, value in profile.items())
    return f"{{\n  {json.dumps(pool)}: {{\n{fields}\n  }}\n}}\n"


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


def _positive_ints(text: str, flag: str) -> list[int]:
    values = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{flag}: {part.strip()!r} is not a positive integer (expected e.g. 1,4,16)")
        values.append(value)
    return values


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _fail(message: str) -> int:
    return fail("inferfleet-runtime profile", message, 2)
