"""Where a paged decode step's time goes: the top torch ops per step (torch.profiler) at given batch sizes, after
the prompts are prefilled (a program, not a test):

    python -m inferfleet_runtime.bench.step_profile [--model DIR] [--batch 1,32] [--threads N] [--steps 20]

The default model is `bench compare`'s (random Llama, hidden 512, 8 layers, vocab 4096, float32). Threads default
to what the server's engine thread uses (`device.cpu_engine_threads`). Each of the kernel facade's five ops
is profiled as one range named `<backend>::<op>`, the native backend's matmul as `native::linear` and its one-call
decoder stack (native.forward, which serves every paged step of a native model) as `native::forward`; C calls are
invisible to the profiler otherwise. A range's self time is what it spends outside the torch ops it calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: bench compare's random Llama)")
    parser.add_argument("--batch", default="1,32", help="running sequences per decode step, comma-separated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the server's choice)")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed and profiled per batch size")
    parser.add_argument("--top", type=int, default=8, help="ops listed per batch size")
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from inferfleet_runtime.device import cpu_engine_threads
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    from .compare import default_model

    torch.set_num_threads(args.threads or cpu_engine_threads())
    model_dir = Path(args.model) if args.model else default_model()
    batches = [int(x) for x in args.batch.split(",") if x.strip()]
    engine = LLMEngine.from_model_dir(model_dir, EngineConfig(device="cpu", max_num_seqs=max(batches)))
    label_kernel_ops(engine.runner)
    vocab = engine.runner.vocab_size
    print(
        f"model {model_dir}; torch threads {torch.get_num_threads()}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}"
    )
    for batch in batches:
        rng = random.Random(batch)
        params = SamplingParams(temperature=0, max_tokens=2 * args.steps + 8, ignore_eos=True)
        for i in range(batch):
            engine.add_request(
                f"profile-{batch}-{i}", [rng.randrange(16, vocab) for _ in range(rng.randint(32, 128))], params
            )
        while engine.scheduler.num_waiting or any(
            s.num_computed_tokens < len(s.prompt_token_ids) for s in engine.scheduler.running
        ):
            engine.step()
        for _ in range(3):
            engine.step()
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        step_ms = (time.perf_counter() - started) / args.steps * 1000
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                engine.step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) or 1
        print(
            f"\nbatch {batch}: {step_ms:.2f} ms/step ({batch / step_ms * 1000:.0f} tok/s), load average "
            f"{os.getloadavg()[0]:.1f}; top ops by self CPU time per step (profiled steps):"
        )
        print(f"  {'op':<44} {'ms/step':>8} {'share':>6} {'calls/step':>10}")
        for e in events[: args.top]:
            print(
                f"  {e.key[:44]:<44} {e.self_cpu_time_total / 1000 / args.steps:>8.2f} "
                f"{100 * e.self_cpu_time_total / total:>5.1f}% {e.count / args.steps:>10.0f}"
            )
        while engine.has_unfinished_requests():
            engine.step()
    return 0


def label_kernel_ops(runner) -> None:
    """Puts each kernel op the runner's model calls inside a profiler range named after its backend and op."""
    from torch.profiler import record_function

    from inferfleet_runtime.layers.linear import NativeLinear

    ops = runner.ops

    def labelled(name, fn):
        label = f"{ops.backend}::{name}"

        def call(*args, **kwargs):
            with record_function(label):
                return fn(*args, **kwargs)

        return call

    names = [f.name for f in dataclasses.fields(ops) if f.name != "backend"]
    wrapped = dataclasses.replace(ops, **{name: labelled(name, getattr(ops, name)) for name in names})
    runner.ops = wrapped  # the per-step attention object takes its ops from here
    if getattr(runner.model, "native_weights", None) is not None:  # the whole decoder stack in one C call
        runner.model.forward = labelled("forward", runner.model.forward)
    for module in runner.model.modules():
        if isinstance(getattr(module, "ops", None), type(ops)):
            module.ops = wrapped
        if isinstance(module, NativeLinear):  # the native matmul, a C call the profiler would not see either
            module.forward = labelled("linear", module.forward)


if __name__ == "__main__":
    sys.exit(main())
