"""Offline comparison on one model and one set of prompts, in one run: our paged engine, our compiled engine and
Hugging Face transformers `generate` (one request at a time, and one left-padded batch) at several concurrencies.
Prints output tokens/s and ratios, KV memory used against a contiguous max-length reservation, and the share of
step time spent outside the model forward at the highest concurrency (a program, not a test):

    python -m inferfleet_runtime.bench.offline [--model DIR] [--concurrency 1,8,32,64] [--skip-compiled] ...

Every engine gets the same token ids and the same per-request output lengths (greedy, EOS ignored), so every
engine computes exactly the same tokens; HF's padded batch runs each batch to its longest request and counts
only the requested tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from inferfleet_runtime.layers.attention_backend import kv_cache_bytes_per_block

from .datasets import parse_range, random_requests, token_counter


@dataclass
class Workload:
    prompt_ids: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(tokenizer, num_requests: int, input_len, output_len, seed: int) -> Workload:
    samples = random_requests(num_requests, input_len, output_len, seed, token_counter(tokenizer))
    return Workload([tokenizer.encode(s.prompt) for s in samples], [s.expected_output_len for s in samples])


# -- our engines ------------------------------------------------------------------------------------------------
class _TimedModel:
    """Wraps the runner's model to add up wall seconds spent in the forward pass and the logits."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0

    def __call__(self, *args):
        started = time.perf_counter()
        out = self.model(*args)
        self.seconds += time.perf_counter() - started
        return out

    def compute_logits(self, hidden):
        started = time.perf_counter()
        out = self.model.compute_logits(hidden)
        self.seconds += time.perf_counter() - started
        return out


def run_engine(engine, work: Workload, profile_at: int | None = None) -> dict:
    """Runs the workload to completion with step(); -> tokens/s, outputs, peak KV blocks, and (profile_at=N) the
    split of step time over the decode steps that ran exactly N sequences."""
    from inferfleet_runtime.engine.sampling_params import SamplingParams

    base = f"offline-{time.monotonic_ns()}"
    for i, (ids, n) in enumerate(zip(work.prompt_ids, work.output_lens)):
        engine.add_request(f"{base}-{i}", ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    outputs: dict[str, list[int]] = {}
    bm = engine.block_manager
    peak = {"used_blocks": 0, "stored_tokens": 0}
    timed = None
    if profile_at is not None and hasattr(engine.runner, "model"):
        timed = engine.runner.model = _TimedModel(engine.runner.model)
    split = {"steps": 0, "step_s": 0.0, "execute_s": 0.0, "forward_s": 0.0}
    execute = engine.runner.execute

    def timed_execute(batch):
        started = time.perf_counter()
        out = execute(batch)
        timed_execute.seconds = time.perf_counter() - started
        timed_execute.is_decode_of = len(batch.seqs) if batch.num_batched_tokens == len(batch.seqs) else None
        return out

    engine.runner.execute = timed_execute
    started = time.perf_counter()
    try:
        while engine.has_unfinished_requests():
            forward_before = timed.seconds if timed else 0.0
            step_started = time.perf_counter()
            for out in engine.step():
                outputs.setdefault(out.request_id, []).extend(out.outputs[0].token_ids if out.outputs else [])
            step_s = time.perf_counter() - step_started
            used = bm.num_used_blocks
            if used > peak["used_blocks"]:
                stored = sum(s.num_computed_tokens for s in engine.scheduler.running)
                peak = {"used_blocks": used, "stored_tokens": stored}
            if timed and timed_execute.is_decode_of == profile_at:  # a decode step of exactly N sequences
                split["steps"] += 1
                split["step_s"] += step_s
                split["execute_s"] += timed_execute.seconds
                split["forward_s"] += timed.seconds - forward_before
    finally:
        engine.runner.execute = execute
        if timed:
            engine.runner.model = timed.model
    seconds = time.perf_counter() - started
    ordered = [outputs[f"{base}-{i}"] for i in range(len(work.output_lens))]
    assert [len(o) for o in ordered] == work.output_lens, "an engine produced other lengths than requested"
    return {
        "seconds": seconds,
        "tok_s": work.num_output_tokens / seconds,
        "outputs": ordered,
        "peak": peak,
        "split": split,
    }


# -- Hugging Face baselines -------------------------------------------------------------------------------------
@torch.inference_mode()
def hf_sequential(model, work: Workload) -> dict:
    outputs = []
    started = time.perf_counter()
    for ids, n in zip(work.prompt_ids, work.output_lens):
        input_ids = torch.tensor([ids])
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        outputs.append(out[0, len(ids) :].tolist())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tok_s": work.num_output_tokens / seconds, "outputs": outputs}


@torch.inference_mode()
def hf_padded_batch(model, work: Workload, pad_id: int) -> dict:
    """One left-padded batch run to the longest requested output; only requested tokens count."""
    width = max(len(ids) for ids in work.prompt_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in work.prompt_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in work.prompt_ids])
    longest = max(work.output_lens)
    started = time.perf_counter()
    model.generate(
        input_ids,
        attention_mask=mask,
        max_new_tokens=longest,
        min_new_tokens=longest,
        do_sample=False,
        pad_token_id=pad_id,
    )
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "tok_s": work.num_output_tokens / seconds,
        "computed_tokens": longest * len(work.output_lens),
    }


def load_hf(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model


# -- compiled engine --------------------------------------------------------------------------------------------
def compiled_engine_dir(model_dir: Path, args) -> tuple[Path | None, str]:
    """(engine directory, "") or (None, why it was skipped); compiles once into the engine cache."""
    if args.skip_compiled:
        return None, "--skip-compiled"
    if args.engine_dir:
        return Path(args.engine_dir), ""
    try:
        from inferfleet_runtime.cli import main as cli
        from inferfleet_runtime.compiled.backends import get_backend
        from inferfleet_runtime.compiled.envelope import Envelope
        from inferfleet_runtime.compiled.export import default_engine_key
        from inferfleet_runtime.compiled.manifest import device_architecture
    except ImportError as exc:
        return None, f"the compiled package is not usable: {exc}"
    device = torch.device("cpu")
    try:
        get_backend("aotinductor").check_available(device)
    except Exception as exc:
        return None, f"aotinductor is not available: {exc}"
    buckets = tuple(sorted({int(x) for x in args.compiled_decode_buckets.split(",") if x.strip()}))
    batch = buckets[-1]
    envelope = Envelope(
        max_context_length=args.compiled_max_context_length,
        max_batch_size=batch,
        dtype="float32",
        decode_buckets=buckets,
        prefill_buckets=(min(64, args.compiled_max_context_length),),
    )
    cache = Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet") / "compiled-engines"
    out = cache / default_engine_key(model_dir, envelope, "aotinductor", device_architecture(device))
    started = time.monotonic()
    code = cli(
        [
            "compile",
            "--model",
            str(model_dir),
            "--out",
            str(out),
            "--backend",
            "aotinductor",
            "--device",
            "cpu",
            "--max-context-length",
            str(envelope.max_context_length),
            "--max-batch-size",
            str(batch),
            "--dtype",
            "float32",
            "--decode-buckets",
            ",".join(map(str, envelope.decode_buckets)),
            "--prefill-buckets",
            ",".join(map(str, envelope.prefill_buckets)),
            "--keep-existing",  # this user's own cache: an intact engine of the key is reused
        ]
    )
    if code != 0:
        return None, f"compile failed with exit code {code}"
    print(f"compiled engine ready in {time.monotonic() - started:.1f}s: {out}", flush=True)
    return out, ""


# -- the run ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--concurrency", default="1,8,32,64", help="requests run together, comma-separated")
    parser.add_argument("--input-len", type=parse_range, default=(16, 48), help="prompt tokens, N or LOW:HIGH")
    parser.add_argument("--output-len", type=parse_range, default=(16, 64), help="output tokens, N or LOW:HIGH")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-compiled", action="store_true", help="leave the compiled engine out")
    parser.add_argument("--engine-dir", default=None, help="use this compiled engine instead of compiling one")
    parser.add_argument(
        "--compiled-decode-buckets",
        default="1,8,32,64",
        help="decode batch sizes compiled; the largest is the engine's batch cap",
    )
    parser.add_argument("--compiled-max-context-length", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for every engine (default 1: no oversubscription on a shared "
        "machine; 0 keeps torch's default)",
    )
    parser.add_argument(
        "--quantization", choices=("none", "int8", "int4"), default="none", help="the paged engine's weights"
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)

    from inferfleet_runtime.demo.builtin_model import ensure_demo_model
    from inferfleet_runtime.engine.config import EngineConfig
    from inferfleet_runtime.engine.llm_engine import LLMEngine

    model_dir = Path(args.model) if args.model else ensure_demo_model()
    top = max(levels)
    paged = LLMEngine.from_model_dir(
        model_dir, EngineConfig(device="cpu", max_num_seqs=top, kernels="auto", quantization=args.quantization)
    )
    tokenizer = paged.tokenizer
    hf = load_hf(model_dir)
    pad_id = hf.generation_config.pad_token_id
    engine_dir, why_skipped = compiled_engine_dir(model_dir, args)
    compiled = None
    if engine_dir is not None:
        try:
            from inferfleet_runtime.compiled.runner import make_compiled_engine

            compiled = make_compiled_engine(engine_dir, EngineConfig(device="cpu"))
        except Exception as exc:
            why_skipped = f"the compiled engine did not load: {type(exc).__name__}: {exc}"
    if compiled is not None and compiled.max_context_length < args.input_len[1] + args.output_len[1]:
        why_skipped = (
            f"the compiled envelope ({compiled.max_context_length} tokens) is shorter than the workload's "
            f"longest request ({args.input_len[1] + args.output_len[1]})"
        )
        compiled = None

    print(
        f"model {model_dir} on cpu, torch threads {torch.get_num_threads()}; prompts {args.input_len[0]}.."
        f"{args.input_len[1]} tokens, outputs {args.output_len[0]}..{args.output_len[1]} tokens per request "
        f"(greedy, EOS ignored), seed {args.seed}"
    )
    print(
        f"compiled engine: {engine_dir} (max batch {compiled.config.max_num_seqs})"
        if compiled
        else f"compiled engine: skipped ({why_skipped})"
    )
    warm = make_workload(tokenizer, 2, (4, 8), (2, 4), args.seed + 1)
    for engine in (paged, compiled) if compiled else (paged,):  # warm-up: first calls allocate and load
        run_engine(engine, warm)
    hf_sequential(hf, warm)
    hf_padded_batch(hf, warm, pad_id)

    rows, figures = [], {"levels": {}, "compiled_skipped": why_skipped or None}
    for level in levels:
        work = make_workload(tokenizer, level, args.input_len, args.output_len, args.seed + level)
        seq, batch = hf_sequential(hf, work), hf_padded_batch(hf, work, pad_id)
        ours = run_engine(paged, work, profile_at=top if level == top else None)
        comp = run_engine(compiled, work) if compiled else None
        agree = sum(a == b for a, b in zip(ours["outputs"], seq["outputs"])) / level
        entry = {
            "requests": level,
            "output_tokens": work.num_output_tokens,
            "hf_sequential_tok_s": seq["tok_s"],
            "hf_padded_batch_tok_s": batch["tok_s"],
            "paged_tok_s": ours["tok_s"],
            "compiled_tok_s": comp["tok_s"] if comp else None,
            "paged_matches_hf_greedy": agree,
            "hf_padded_batch_computed_tokens": batch["computed_tokens"],
        }
        if comp:
            entry["compiled_matches_paged_greedy"] = (
                sum(a == b for a, b in zip(comp["outputs"], ours["outputs"])) / level
            )
        figures["levels"][str(level)] = entry
        if level == top:
            figures["kv_memory"] = kv_figures(paged, work, ours["peak"])
            figures["step_split"] = split_figures(ours["split"], top)
        rows.append(entry)
        print(f"... concurrency {level} done", flush=True)

    print_table(rows)
    print_kv(figures["kv_memory"], compiled)
    print_split(figures["step_split"])
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def kv_figures(engine, work: Workload, peak: dict) -> dict:
    block_size = engine.config.block_size
    bytes_per_token = kv_cache_bytes_per_block(engine.runner.model_config, block_size) // block_size
    final_tokens = sum(len(p) + n for p, n in zip(work.prompt_ids, work.output_lens))
    reserved_tokens = len(work.output_lens) * engine.max_context_length
    paged_slots = peak["used_blocks"] * block_size
    return {
        "requests": len(work.output_lens),
        "block_size": block_size,
        "bytes_per_token": bytes_per_token,
        "max_context_length": engine.max_context_length,
        "final_tokens": final_tokens,
        "paged_peak_blocks": peak["used_blocks"],
        "paged_peak_slot_tokens": paged_slots,
        "paged_peak_stored_tokens": peak["stored_tokens"],
        "paged_waste_pct": 100 * (1 - peak["stored_tokens"] / paged_slots) if paged_slots else 0.0,
        "contiguous_reserved_tokens": reserved_tokens,
        "contiguous_waste_pct": 100 * (1 - final_tokens / reserved_tokens),
    }


def split_figures(split: dict, num_seqs: int) -> dict:
    step = split["step_s"] or 1e-12
    bookkeeping = split["step_s"] - split["execute_s"]
    prep = split["execute_s"] - split["forward_s"]
    return {
        "num_seqs": num_seqs,
        "steps": split["steps"],
        "step_ms": 1000 * split["step_s"] / max(split["steps"], 1),
        "schedule_postprocess_pct": 100 * bookkeeping / step,
        "runner_prep_sampling_pct": 100 * prep / step,
        "forward_pct": 100 * split["forward_s"] / step,
    }


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'conc':>5} {'out tok':>8} {'HF seq':>9} {'HF batch':>9} {'paged':>9} {'compiled':>9}  "
        f"{'paged/seq':>9} {'paged/bat':>9} {'comp/seq':>9} {'comp/bat':>9} {'greedy=HF':>9}"
    )
    print("\noutput tokens/s (and ratios)\n" + head)
    for r in rows:
        comp = r["compiled_tok_s"]
        cells = [
            f"{r['requests']:>5}",
            f"{r['output_tokens']:>8}",
            f"{r['hf_sequential_tok_s']:>9.1f}",
            f"{r['hf_padded_batch_tok_s']:>9.1f}",
            f"{r['paged_tok_s']:>9.1f}",
            f"{comp:>9.1f}" if comp else f"{'-':>9}",
            f" {r['paged_tok_s'] / r['hf_sequential_tok_s']:>9.2f}",
            f"{r['paged_tok_s'] / r['hf_padded_batch_tok_s']:>9.2f}",
            f"{comp / r['hf_sequential_tok_s']:>9.2f}" if comp else f"{'-':>9}",
            f"{comp / r['hf_padded_batch_tok_s']:>9.2f}" if comp else f"{'-':>9}",
            f"{100 * r['paged_matches_hf_greedy']:>8.0f}%",
        ]
        print(" ".join(cells))


def print_kv(kv: dict, compiled) -> None:
    mib = kv["bytes_per_token"] / 2**20
    print(f"\nKV memory at {kv['requests']} concurrent requests ({kv['bytes_per_token']} bytes/token):")
    print(
        f"  paged peak: {kv['paged_peak_blocks']} blocks x {kv['block_size']} = {kv['paged_peak_slot_tokens']} token "
        f"slots ({kv['paged_peak_slot_tokens'] * mib:.2f} MiB) holding {kv['paged_peak_stored_tokens']} tokens: "
        f"waste {kv['paged_waste_pct']:.1f}%"
    )
    print(
        f"  contiguous max-length reservation: {kv['requests']} x {kv['max_context_length']} = "
        f"{kv['contiguous_reserved_tokens']} token slots ({kv['contiguous_reserved_tokens'] * mib:.2f} MiB) for "
        f"{kv['final_tokens']} tokens at the end: waste {kv['contiguous_waste_pct']:.1f}%"
    )
    if compiled:
        env = compiled.runner.envelope
        print(f"  (the compiled engine reserves {env.max_batch_size} x {env.max_context_length} static slots)")


def print_split(split: dict) -> None:
    print(
        f"\nstep time at {split['num_seqs']} running sequences ({split['steps']} steps, "
        f"{split['step_ms']:.1f} ms/step): schedule+postprocess {split['schedule_postprocess_pct']:.1f}%, "
        f"runner input prep+sampling {split['runner_prep_sampling_pct']:.1f}%, "
        f"model forward {split['forward_pct']:.1f}%"
    )


if __name__ == "__main__":
    sys.exit(main())
