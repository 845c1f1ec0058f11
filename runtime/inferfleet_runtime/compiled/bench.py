"""Compiled vs paged engine on the same model in the same run: compile time, per-token decode latency at batch 1,
decode throughput at the largest decode bucket. Prints figures and ratios (a program, not a test):

    python -m inferfleet_runtime.compiled.bench [--model DIR] [--engine-dir DIR] [--max-batch-size 8] ...

Without --model the built-in model is used; without --engine-dir the engine is compiled into a temporary
directory (so the compile time is measured); with it, an existing engine is reused.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Beautiful is better than ugly. Explicit is better than"


def decode_step_seconds(engine, num_seqs: int, num_tokens: int) -> list[float]:
    """Wall seconds of each engine step once all num_seqs prompts are prefilled (one new token per sequence)."""
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    for i in range(num_seqs):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", PROMPT, params)
    seconds = []
    while engine.has_unfinished_requests():
        is_decode = (
            all(s.num_computed_tokens == s.num_tokens - 1 for s in engine.scheduler.running)
            and engine.scheduler.num_running == num_seqs
            and not engine.scheduler.num_waiting
        )
        started = time.perf_counter()
        engine.step()
        if is_decode:
            seconds.append(time.perf_counter() - started)
    return seconds


def measure(engine, max_batch: int, num_tokens: int) -> dict:
    decode_step_seconds(engine, 1, 4)  # warm-up
    batch1 = decode_step_seconds(engine, 1, num_tokens)
    batched = decode_step_seconds(engine, max_batch, num_tokens)
    return {"latency_ms": 1000 * statistics.median(batch1), "throughput_tok_s": max_batch / statistics.median(batched)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--engine-dir", default=None, help="reuse this compiled engine instead of compiling")
    parser.add_argument("--max-context-length", type=int, default=256)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--prefill-buckets", default="64")
    parser.add_argument("--num-tokens", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads for both engines (default: torch's); 1 on a shared machine",
    )
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from inferfleet_runtime.cli import main as cli
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine

    from .manifest import read_manifest
    from .runner import make_compiled_engine

    model_dir = Path(args.model) if args.model else ensure_demo_model()
    engine_dir = Path(args.engine_dir) if args.engine_dir else Path(tempfile.mkdtemp(prefix="inferfleet-bench-")) / "e"
    if not args.engine_dir:
        started = time.monotonic()
        code = cli(
            [
                "compile",
                "--model",
                str(model_dir),
                "--out",
                str(engine_dir),
                "--backend",
                "aotinductor",
                "--device",
                "cpu",
                "--max-context-length",
                str(args.max_context_length),
                "--max-batch-size",
                str(args.max_batch_size),
                "--decode-buckets",
                f"1,{args.max_batch_size}",
                "--prefill-buckets",
                args.prefill_buckets,
            ]
        )
        if code != 0:
            return code
        print(f"compile_seconds={time.monotonic() - started:.1f}")
    manifest = read_manifest(engine_dir)
    max_batch = manifest.envelope.max_batch_size
    import torch

    print(
        f"threads={torch.get_num_threads()} engine={manifest.engine_key} backend={manifest.backend} arch={manifest.target_architecture} "
        f"graphs={len(manifest.graphs)} build_seconds={manifest.build_seconds} "
        f"graph_bytes={manifest.sizes['graph_bytes']}"
    )
    compiled = measure(make_compiled_engine(engine_dir, EngineConfig(device="cpu")), max_batch, args.num_tokens)
    paged = measure(
        LLMEngine.from_model_dir(model_dir, EngineConfig(device="cpu", max_num_seqs=max_batch)),
        max_batch,
        args.num_tokens,
    )
    for name, figures in (("compiled", compiled), ("paged", paged)):
        print(
            f"{name}: batch1_per_token_latency_ms={figures['latency_ms']:.3f} "
            f"batch{max_batch}_throughput_tok_s={figures['throughput_tok_s']:.1f}"
        )
    print(f"ratio latency compiled/paged={compiled['latency_ms'] / paged['latency_ms']:.3f} (target <= 0.67)")
    print(f"ratio throughput compiled/paged={compiled['throughput_tok_s'] / paged['throughput_tok_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
