"""`inferfleet-runtime profile`: measures, offline on the paged engine, the service rates the router routes a pool by
(prefill tokens/s against prompt length, decode tokens/s against batch size, the batch and KV limits) and writes them
in the router's --profile-file shape, under one pool's name. How each point is measured: engine/calibration.py
(`--repeats` runs or windows of `--decode-steps` steps per point).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferfleet_runtime.engine.calibration import check_fits, measure, progress
from inferfleet_runtime.server.cli import add_engine_arguments, check_paged_model, config_from_args
from inferfleet_runtime.termination import fail

DEFAULT_POOL = "default"  # the router's pool of endpoints given without one


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
        progress(
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
        progress(f"Wrote the profile of pool {args.pool!r} to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def profile_json(pool: str, profile: dict) -> str:
    """{pool: profile} as the router's --profile-file reads it, a field a line (pool files merge with `jq -s add`)."""
    fields = ",\n".join(f"    {json.dumps(key)}: {json.dumps(value)}" for key, value in profile.items())
    return f"{{\n  {json.dumps(pool)}: {{\n{fields}\n  }}\n}}\n"


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


def _fail(message: str) -> int:
    return fail("inferfleet-runtime profile", message, 2)
