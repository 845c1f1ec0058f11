"""GPU check: compiles every Triton kernel, checks it against its torch reference and prints bandwidth.

    python -m inferfleet_runtime.kernels.gpu_check [--dtype bfloat16] [--iters 20] [--sweep]

On a CUDA (or ROCm) device: measures the device copy bandwidth (a large tensor copy, bytes read +
written per second), then for each kernel case the achieved bandwidth (the bytes the kernel must
move, divided by its median time over CUDA events) and that as a fraction of the copy bandwidth.
The issue's target: paged decode attention at >= 0.80 of copy bandwidth for long contexts on an
H100/H200-class GPU. Without a GPU it exits with code 2 and says so. Exit code 1: a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

import torch

from . import activation, kv_cache, paged_attention, rms_norm, rotary

TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16  # Llama-3-8B attention shape
# Decode batches: (num_seqs, context length). The first ones are the long-context target.
DECODE_CASES = [(1, 32768), (4, 32768), (8, 8192), (64, 4096), (256, 1024)]
PREFILL_CASES = [(4, 1024, 1024)]  # (num_seqs, cached prefix, new tokens)


@dataclass(frozen=True)
class Case:
    name: str
    run: object  # () -> output tensor(s) of the Triton kernel
    reference: object  # () -> same from the torch reference
    num_bytes: int  # memory the kernel must move at least
    num_flops: int = 0


def median_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth(iters: int) -> float:
    """Bytes per second of a 2 GiB device-to-device copy, counting the read and the write."""
    src = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def paged_batch(seq_lens, dtype, gen):
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    value_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    ids = (torch.randperm(num_blocks - 1, generator=gen, device="cuda") + 1).int()
    block_tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device="cuda")
    offset = 0
    for b, n in enumerate(blocks):
        block_tables[b, :n] = ids[offset:offset + n]
        offset += n
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return key_cache, value_cache, block_tables, seq_lens_t


def decode_case(num_seqs, context, dtype, gen, plan=None, label=""):
    key_cache, value_cache, block_tables, seq_lens = paged_batch([context] * num_seqs, dtype, gen)
    query = torch.randn(num_seqs, NUM_HEADS, HEAD_DIM, generator=gen, device="cuda").to(dtype)
    args = (query, key_cache, value_cache, block_tables, seq_lens, HEAD_DIM ** -0.5)
    kv_bytes = 2 * num_seqs * context * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
    return Case(
        f"paged decode {num_seqs}x{context}{label}",
        lambda: paged_attention.paged_attention(*args, max_seq_len=context, plan=plan),
        lambda: paged_attention.paged_attention_reference(*args),
        kv_bytes + 2 * query.numel() * query.element_size() + block_tables.numel() * 4,
        num_flops=4 * num_seqs * context * NUM_HEADS * HEAD_DIM,
    )


def prefill_case(num_seqs, prefix, new, dtype, gen):
    key_cache, value_cache, block_tables, seq_lens = paged_batch([prefix + new] * num_seqs, dtype, gen)
    query = torch.randn(num_seqs * new, NUM_HEADS, HEAD_DIM, generator=gen, device="cuda").to(dtype)
    starts = torch.arange(0, num_seqs * new + 1, new, dtype=torch.int32, device="cuda")
    args = (query, key_cache, value_cache, block_tables, seq_lens, HEAD_DIM ** -0.5)
    kwargs = dict(query_start_loc=starts, max_query_len=new, max_seq_len=prefix + new)
    kv_bytes = 2 * num_seqs * (prefix + new) * NUM_KV_HEADS * HEAD_DIM * key_cache.element_size()
    # Causal: each new token attends to prefix + its position; QK^T and PV are 2 flops per MAC each.
    num_pairs = num_seqs * (new * prefix + new * (new + 1) // 2)
    return Case(
        f"paged prefill {num_seqs}x({prefix}+{new})",
        lambda: paged_attention.paged_attention(*args, **kwargs),
        lambda: paged_attention.paged_attention_reference(*args, **kwargs),
        kv_bytes + 2 * query.numel() * query.element_size(),
        num_flops=4 * num_pairs * NUM_HEADS * HEAD_DIM,
    )


def elementwise_cases(dtype, gen):
    num_tokens, hidden, intermediate = 8192, 4096, 14336
    element = torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(num_tokens, hidden, generator=gen, device="cuda").to(dtype)
    residual = torch.randn(num_tokens, hidden, generator=gen, device="cuda").to(dtype)
    weight = torch.randn(hidden, generator=gen, device="cuda").to(dtype)
    gate_up = torch.randn(num_tokens, 2 * intermediate, generator=gen, device="cuda").to(dtype)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, generator=gen, device="cuda").to(dtype)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen, device="cuda").to(dtype)
    positions = torch.randint(0, 8192, (num_tokens,), generator=gen, device="cuda")
    cache = torch.randn(8192, HEAD_DIM, generator=gen, device="cuda")
    num_slots = 4 * num_tokens
    caches = [torch.zeros(num_slots // BLOCK_SIZE, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device="cuda")
              for _ in range(4)]
    slots = torch.randperm(num_slots, generator=gen, device="cuda")[:num_tokens]

    def write(fn, key_cache, value_cache):
        fn(k, k, key_cache, value_cache, slots)
        return key_cache, value_cache

    kv_row = NUM_KV_HEADS * HEAD_DIM * element
    return [
        Case(f"rms_norm+residual {num_tokens}x{hidden}", lambda: rms_norm.rms_norm(x, weight, 1e-5, residual),
             lambda: rms_norm.rms_norm_reference(x, weight, 1e-5, residual), 4 * x.numel() * element),
        Case(f"silu_and_mul {num_tokens}x{intermediate}", lambda: activation.silu_and_mul(gate_up),
             lambda: activation.silu_and_mul_reference(gate_up), 3 * num_tokens * intermediate * element),
        Case(f"rotary {num_tokens}x({NUM_HEADS}+{NUM_KV_HEADS})x{HEAD_DIM}",
             lambda: rotary.rotary(q, k, positions, cache), lambda: rotary.rotary_reference(q, k, positions, cache),
             2 * (q.numel() + k.numel()) * element + num_tokens * HEAD_DIM * 4),
        Case(f"write_kv {num_tokens} tokens", lambda: write(kv_cache.write_kv, *caches[:2]),
             lambda: write(kv_cache.write_kv_reference, *caches[2:]), 4 * num_tokens * kv_row + num_tokens * 8),
    ]


def sweep_cases(dtype, gen):
    """Decode tile variants for the long-context cases, to pick the planner's defaults on a GPU."""
    for num_seqs, context in DECODE_CASES[:2]:
        base = paged_attention.plan_paged_attention(
            num_seqs=num_seqs, num_q_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
            max_query_len=1, max_seq_len=context, is_decode=True,
            num_sms=torch.cuda.get_device_properties(0).multi_processor_count)
        for block_n in (16, 32, 64):
            for num_warps in (2, 4, 8):
                for num_stages in (2, 3):
                    partition = -(-base.partition_size // block_n) * block_n
                    plan = dataclasses.replace(base, block_n=block_n, partition_size=partition,
                                               num_partitions=-(-context // partition), num_warps=num_warps,
                                               num_stages=num_stages)
                    yield decode_case(num_seqs, context, dtype, gen, plan,
                                      f" n{block_n} w{num_warps} s{num_stages} p{plan.num_partitions}")


def timed_cases(dtype, gen, sweep: bool):
    """Built one at a time, so each case's tensors are freed before the next is allocated."""
    yield from elementwise_cases(dtype, gen)
    for num_seqs, context in DECODE_CASES:
        yield decode_case(num_seqs, context, dtype, gen)
    for num_seqs, prefix, new in PREFILL_CASES:
        yield prefill_case(num_seqs, prefix, new, dtype, gen)
    if sweep:
        yield from sweep_cases(dtype, gen)


def check(case: Case, dtype) -> tuple[bool, float]:
    got, want = case.run(), case.reference()
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    err = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
    try:
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOLERANCES[dtype])
        return True, err
    except AssertionError:
        return False, err


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferfleet_runtime.kernels.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--sweep", action="store_true", help="also time decode tile variants")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA or ROCm GPU is visible to torch; nothing was compiled or measured", file=sys.stderr)
        return 2
    from ._triton import is_interpreting

    if is_interpreting():
        print("gpu_check: TRITON_INTERPRET is set; unset it to compile for the GPU", file=sys.stderr)
        return 2
    import triton

    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    copy_bw = copy_bandwidth(args.iters)
    print(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (2 GiB copy, read + write)")
    print(f"dtype: {args.dtype}")
    header = f"{'kernel case':<44} {'ok':>3} {'max err':>9} {'time us':>9} {'GB/s':>7} {'of copy':>7} {'TFLOP/s':>8}"
    print(header)
    print("-" * len(header))
    num_failed = 0
    for case in timed_cases(dtype, gen, args.sweep):
        ok, err = check(case, dtype)
        num_failed += not ok
        ms = median_ms(case.run, args.iters)
        bw = case.num_bytes / (ms / 1e3)
        tflops = f"{case.num_flops / (ms / 1e3) / 1e12:8.1f}" if case.num_flops else f"{'':8}"
        print(f"{case.name:<44} {'yes' if ok else 'NO':>3} {err:9.2e} {ms * 1e3:9.1f} {bw / 1e9:7.0f} {bw / copy_bw:7.2f} {tflops}")
    # Correctness in the other dtypes (and fp32, the tf32-free path) on small decode and prefill cases.
    for other in (torch.float16, torch.bfloat16, torch.float32):
        for case in (decode_case(3, 1000, other, gen), prefill_case(2, 37, 50, other, gen)):
            ok, err = check(case, other)
            num_failed += not ok
            print(f"{case.name + ' ' + str(other)[6:]:<44} {'yes' if ok else 'NO':>3} {err:9.2e}")
    print("all checks passed" if not num_failed else f"{num_failed} checks FAILED")
    return 1 if num_failed else 0


if __name__ == "__main__":
    sys.exit(main())
