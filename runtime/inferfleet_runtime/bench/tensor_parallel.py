"""Tensor parallelism on this machine, one run: for each size, the paged engine's start-up time, output tokens/s
at each concurrency, the share of rank 0's run spent in collectives (waiting for the slower rank included) and the
resident memory of every rank. Every size gets the same prompt ids and output lengths (greedy, EOS ignored), and
its outputs are checked against the first size's (a program, not a test):

    python -m inferfleet_runtime.bench.tensor_parallel [--model DIR] [--sizes 1,2] [--concurrency 1,8,32]

Each size runs in a process of its own (its rank 0 starts the other ranks); on a CPU the ranks share the cores,
each with cores / size torch threads.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_size(model_dir: str, size: int, levels: list[int], input_len: int, output_len: int, seed: int) -> dict:
    """In this process: rank 0 of `size` (workers started by the engine) -> the figures of this size."""
    import os

    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.engine.sampling_params import SamplingParams
    from inferfleet_runtime.layers import parallel

    started = time.perf_counter()
    config = EngineConfig(device="cpu", tensor_parallel_size=size, max_num_seqs=max(levels))
    engine = LLMEngine.from_model_dir(model_dir, config)
    load_s = time.perf_counter() - started
    if size == 1:  # a size-1 engine is the serving one: the engine thread's torch threads, all cores
        import torch

        from inferfleet_runtime.device import cpu_engine_threads

        torch.set_num_threads(cpu_engine_threads())
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    rng = random.Random(seed)
    vocab = engine.runner.vocab_size
    engine.generate([[rng.randrange(3, vocab) for _ in range(4)]] * 2, params)  # warm-up
    figures = {"size": size, "load_s": load_s, "levels": {}}
    for level in levels:
        prompts = [[rng.randrange(3, vocab) for _ in range(input_len)] for _ in range(level)]
        before, began = parallel.collective_seconds, time.perf_counter()
        outputs = engine.generate(prompts, params)
        wall = time.perf_counter() - began
        figures["levels"][str(level)] = {
            "tok_s": level * output_len / wall,
            "collective_share": (parallel.collective_seconds - before) / wall,
            "outputs": [out.outputs[0].token_ids for out in outputs],
        }
    workers = engine.runner.workers.processes if engine.runner.workers else {}
    figures["rss_mib"] = [rss_mib(os.getpid())] + [rss_mib(p.pid) for _, p in sorted(workers.items())]
    model = engine.runner.model  # every rank's tensors have rank 0's shapes
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    figures["weights_mib"] = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    figures["kv_mib"] = sum(k.numel() * k.element_size() * 2 for k, _ in engine.runner.kv_caches) / 2**20
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--sizes", default="1,2", help="tensor-parallel sizes, comma-separated")
    parser.add_argument("--concurrency", default="1,8,32", help="requests run together, comma-separated")
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figures as JSON")
    parser.add_argument("--one-size", type=int, default=None, help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.model is None:
        from inferfleet_runtime.demo.builtin_model import ensure_demo_model

        args.model = str(ensure_demo_model())
    if args.one_size is not None:
        figures = run_size(args.model, args.one_size, levels, args.input_len, args.output_len, args.seed)
        print(json.dumps(figures))
        return 0
    results = []
    for size in [int(x) for x in args.sizes.split(",") if x.strip()]:
        child = [sys.executable, "-m", "inferfleet_runtime.bench.tensor_parallel", "--model", args.model,
                 "--one-size", str(size), "--concurrency", args.concurrency, "--input-len", str(args.input_len),
                 "--output-len", str(args.output_len), "--seed", str(args.seed)]  # fmt: skip
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"size {size} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(
        f"model {args.model} on cpu; prompts {args.input_len} tokens, outputs {args.output_len} (greedy, EOS ignored)"
    )
    print(f"{'size':>4} {'load s':>7} {'conc':>5} {'tok/s':>9} {'vs first':>8} {'collectives':>11} {'same tokens':>11}")
    for figures in results:
        for level, entry in figures["levels"].items():
            first = base["levels"][level]
            same = entry["outputs"] == first["outputs"]
            print(
                f"{figures['size']:>4} {figures['load_s']:>7.2f} {level:>5} {entry['tok_s']:>9.1f} "
                f"{entry['tok_s'] / first['tok_s']:>7.2f}x {entry['collective_share']:>10.1%} {str(same):>11}"
            )
        print(
            f"     per rank: RSS {', '.join(f'{m:.0f}' for m in figures['rss_mib'])} MiB; model tensors "
            f"{figures['weights_mib']:.1f} MiB, KV cache {figures['kv_mib']:.1f} MiB"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
