"""GPU check: compiles every Triton kernel, checks it against its torch reference and prints bandwidth.

    python -m inferfleet_runtime.kernels.gpu_check [--dtype bfloat16] [--iters 20] [--sweep]

On a CUDA (or ROCm) device: measures the device copy bandwidth (a large tensor copy, bytes read +
written per second), then for each kernel case the achieved bandwidth (the bytes the kernel must
move, divided by its median time over CUDA events) and that as a fraction of the copy bandwidth.
The issue's target: paged decode attention at >= 0.80 of copy bandwidth for long contexts on an
H100/H200-class GPU. Without a GPU it exits with code 2 and says so. Exit code 1: a check failed.
`--cpu-smoke` runs the same harness on tiny shapes on the CPU under TRITON_INTERPRET=1 (its
figures mean nothing; it tests the script).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass

import torch

from inferfleet_runtime.model_config import DTYPES

from . import activation, fused_moe, kv_cache, paged_attention, quantized_matmul, rms_norm, rotary
from ._triton import is_interpreting

TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@dataclass(frozen=True)
class Shapes:
    num_heads: int = 32  # Llama-3-8B attention and MLP shapes
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    # Decode batches: (num_seqs, context length); the first two are the long-context target.
    decode_cases: tuple = ((1, 32768), (4, 32768), (8, 8192), (64, 4096), (256, 1024))
    prefill_cases: tuple = ((4, 1024, 1024),)  # (num_seqs, cached prefix, new tokens)
    num_tokens: int = 8192
    hidden: int = 4096
    intermediate: int = 14336
    copy_numel: int = 1 << 30  # fp16 elements: a 2 GiB copy
    check_cases: tuple = ((3, 1000), (2, 37, 50))  # small decode / prefill checks in every dtype


SMOKE = Shapes(
    num_heads=4,
    num_kv_heads=2,
    head_dim=80,
    block_size=8,
    decode_cases=((2, 40), (1, 130)),
    prefill_cases=((2, 9, 7),),
    num_tokens=3,
    hidden=96,
    intermediate=40,
    copy_numel=1 << 16,
    check_cases=((2, 20), (2, 5, 6)),
)


@dataclass(frozen=True)
class Case:
    name: str
    run: object  # () -> output tensor(s) of the Triton kernel
    reference: object  # () -> same from the torch reference
    num_bytes: int  # memory the kernel must move at least
    num_flops: int = 0


def median_ms(fn, iters: int, device: torch.device) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append((time.perf_counter() - started) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(shapes: Shapes, iters: int, device) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    src = torch.empty(shapes.copy_numel, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), iters, device)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def paged_batch(shapes: Shapes, seq_lens, dtype, gen, device):
    blocks = [-(-n // shapes.block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    shape = (num_blocks, shapes.block_size, shapes.num_kv_heads, shapes.head_dim)
    key_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    value_cache = torch.randn(shape, generator=gen, device=device).to(dtype)
    ids = (torch.randperm(num_blocks - 1, generator=gen, device=device) + 1).int()
    block_tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device=device)
    offset = 0
    for b, n in enumerate(blocks):
        block_tables[b, :n] = ids[offset : offset + n]
        offset += n
    return key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32, device=device)


def decode_case(shapes: Shapes, num_seqs, context, dtype, gen, device, plan=None, label=""):
    key_cache, value_cache, block_tables, seq_lens = paged_batch(shapes, [context] * num_seqs, dtype, gen, device)
    query = torch.randn(num_seqs, shapes.num_heads, shapes.head_dim, generator=gen, device=device).to(dtype)
    args = (query, key_cache, value_cache, block_tables, seq_lens, shapes.head_dim**-0.5)
    kv_bytes = 2 * num_seqs * context * shapes.num_kv_heads * shapes.head_dim * key_cache.element_size()
    return Case(
        f"paged decode {num_seqs}x{context}{label}",
        lambda: paged_attention.paged_attention(*args, max_seq_len=context, plan=plan),
        lambda: paged_attention.paged_attention_reference(*args),
        kv_bytes + 2 * query.numel() * query.element_size() + block_tables.numel() * 4,
        num_flops=4 * num_seqs * context * shapes.num_heads * shapes.head_dim,
    )


def prefill_case(shapes: Shapes, num_seqs, prefix, new, dtype, gen, device):
    key_cache, value_cache, block_tables, seq_lens = paged_batch(shapes, [prefix + new] * num_seqs, dtype, gen, device)
    query = torch.randn(num_seqs * new, shapes.num_heads, shapes.head_dim, generator=gen, device=device).to(dtype)
    starts = torch.arange(0, num_seqs * new + 1, new, dtype=torch.int32, device=device)
    args = (query, key_cache, value_cache, block_tables, seq_lens, shapes.head_dim**-0.5)
    kwargs = dict(query_start_loc=starts, max_query_len=new, max_seq_len=prefix + new)
    kv_bytes = 2 * num_seqs * (prefix + new) * shapes.num_kv_heads * shapes.head_dim * key_cache.element_size()
    # Causal: new token t sees prefix + t + 1 keys; QK^T and PV are 2 flops per multiply-add each.
    num_pairs = num_seqs * (new * prefix + new * (new + 1) // 2)
    return Case(
        f"paged prefill {num_seqs}x({prefix}+{new})",
        lambda: paged_attention.paged_attention(*args, **kwargs),
        lambda: paged_attention.paged_attention_reference(*args, **kwargs),
        kv_bytes + 2 * query.numel() * query.element_size(),
        num_flops=4 * num_pairs * shapes.num_heads * shapes.head_dim,
    )


def elementwise_cases(shapes: Shapes, dtype, gen, device):
    s = shapes
    element = torch.tensor([], dtype=dtype).element_size()
    randn = lambda *shape: torch.randn(shape, generator=gen, device=device).to(dtype)  # noqa: E731
    x, residual, weight = randn(s.num_tokens, s.hidden), randn(s.num_tokens, s.hidden), randn(s.hidden)
    gate_up = randn(s.num_tokens, 2 * s.intermediate)
    q, k = randn(s.num_tokens, s.num_heads, s.head_dim), randn(s.num_tokens, s.num_kv_heads, s.head_dim)
    max_positions = max(16, s.num_tokens)
    positions = torch.randint(0, max_positions, (s.num_tokens,), generator=gen, device=device)
    cos_sin = torch.randn(max_positions, s.head_dim, generator=gen, device=device)
    num_slots = 4 * s.num_tokens * s.block_size
    caches = [
        torch.zeros(num_slots // s.block_size, s.block_size, s.num_kv_heads, s.head_dim, dtype=dtype, device=device)
        for _ in range(4)
    ]
    slots = torch.randperm(num_slots, generator=gen, device=device)[: s.num_tokens]

    def write(fn, key_cache, value_cache):
        fn(k, k, key_cache, value_cache, slots)
        return key_cache, value_cache

    kv_row = s.num_kv_heads * s.head_dim * element
    return [
        Case(
            f"rms_norm+residual {s.num_tokens}x{s.hidden}",
            lambda: rms_norm.rms_norm(x, weight, 1e-5, residual),
            lambda: rms_norm.rms_norm_reference(x, weight, 1e-5, residual),
            4 * x.numel() * element,
        ),
        Case(
            f"silu_and_mul {s.num_tokens}x{s.intermediate}",
            lambda: activation.silu_and_mul(gate_up),
            lambda: activation.silu_and_mul_reference(gate_up),
            3 * s.num_tokens * s.intermediate * element,
        ),
        Case(
            f"rotary {s.num_tokens}x({s.num_heads}+{s.num_kv_heads})x{s.head_dim}",
            lambda: rotary.rotary(q, k, positions, cos_sin),
            lambda: rotary.rotary_reference(q, k, positions, cos_sin),
            2 * (q.numel() + k.numel()) * element + s.num_tokens * s.head_dim * 4,
        ),
        Case(
            f"write_kv {s.num_tokens} tokens",
            lambda: write(kv_cache.write_kv, *caches[:2]),
            lambda: write(kv_cache.write_kv_reference, *caches[2:]),
            4 * s.num_tokens * kv_row + s.num_tokens * 8,
        ),
    ]


def moe_cases(shapes: Shapes, dtype, gen, device, num_experts: int = 8, top_k: int = 2):
    """The fused experts at Mixtral-8x7B's widths (8 experts, top-2) for 1 token, 64 and num_tokens, against the
    torch path run in float32 (the kernel accumulates in float32 and rounds once, after SiLU-and-mul)."""
    s = shapes
    element = torch.tensor([], dtype=dtype).element_size()
    scale = lambda t, fan_in: (t / fan_in**0.5).to(dtype)  # noqa: E731  (outputs of order 1)
    w_gate_up = scale(torch.randn(num_experts, 2 * s.intermediate, s.hidden, generator=gen, device=device), s.hidden)
    w_down = scale(torch.randn(num_experts, s.hidden, s.intermediate, generator=gen, device=device), s.intermediate)
    for num_tokens in sorted({1, min(64, s.num_tokens), s.num_tokens}):
        x = torch.randn(num_tokens, s.hidden, generator=gen, device=device).to(dtype)
        logits = torch.randn(num_tokens, num_experts, generator=gen, device=device)
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
        touched = int(torch.unique(ids).numel())
        yield Case(
            f"fused_experts {num_tokens} tokens e{num_experts}k{top_k} {s.hidden}x{s.intermediate}",
            lambda x=x, weights=weights, ids=ids: fused_moe.fused_experts(x, w_gate_up, w_down, weights, ids),
            lambda x=x, weights=weights, ids=ids: fused_moe.fused_experts_reference(
                x.float(), w_gate_up.float(), w_down.float(), weights, ids
            ).to(dtype),
            touched * 3 * s.hidden * s.intermediate * element + 2 * x.numel() * element,
            2 * num_tokens * top_k * 3 * s.hidden * s.intermediate,
        )


def quantized_cases(shapes: Shapes, dtype, gen, device):
    """Weight-only matmuls at the MLP's up width (intermediate x hidden): int8 per channel, int4 group-wise and FP8
    per channel, for 1, 16 and num_tokens rows, against the torch reference (float32 dequantization, one matmul)."""
    s = shapes
    n, k = s.intermediate, s.hidden
    group = 128 if k % 128 == 0 else 32
    element = torch.tensor([], dtype=dtype).element_size()
    ints = torch.randint(-127, 128, (n, k), generator=gen, device=device, dtype=torch.int32)
    weights = {  # (weight, scales, bits, group size, bytes read); outputs of order 1
        "int8": (ints.to(torch.int8), torch.full((n, 1), 1 / (127 * k**0.5), device=device), 8, k, n * k),
        "int4": (
            torch.randint(0, 256, (n, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8),
            torch.full((n, k // group), 1 / (8 * k**0.5), device=device), 4, group, n * k // 2,
        ),
        "fp8": (
            (ints.float() / 127 * 4).to(torch.float8_e4m3fn), torch.full((n, 1), 0.25 / k**0.5, device=device), 8, k,
            n * k,
        ),
    }  # fmt: skip
    for num_tokens in sorted({1, 16, s.num_tokens}):
        x = torch.randn(num_tokens, k, generator=gen, device=device).to(dtype)
        for name, (weight, scales, bits, group_size, weight_bytes) in weights.items():
            scales = scales.to(dtype)
            args = (x, weight, scales, None, None, bits, group_size)
            yield Case(
                f"quantized_matmul {name} {num_tokens}x{k} -> {n}",
                lambda args=args: quantized_matmul.quantized_matmul(*args),
                lambda args=args: quantized_matmul.quantized_matmul_reference(*args),
                weight_bytes + scales.numel() * element + (x.numel() + num_tokens * n) * element,
                2 * num_tokens * n * k,
            )


def sweep_cases(shapes: Shapes, dtype, gen, device, num_sms):
    """Decode tile variants for the long-context cases, to pick the planner's defaults on a GPU."""
    for num_seqs, context in shapes.decode_cases[:2]:
        base = paged_attention.plan_paged_attention(
            num_seqs=num_seqs,
            num_q_heads=shapes.num_heads,
            num_kv_heads=shapes.num_kv_heads,
            head_dim=shapes.head_dim,
            max_query_len=1,
            max_seq_len=context,
            is_decode=True,
            num_sms=num_sms,
        )
        for block_n in (16, 32, 64):
            for num_warps in (2, 4, 8):
                for num_stages in (2, 3):
                    partition = -(-base.partition_size // block_n) * block_n
                    plan = dataclasses.replace(
                        base,
                        block_n=block_n,
                        partition_size=partition,
                        num_partitions=-(-context // partition),
                        num_warps=num_warps,
                        num_stages=num_stages,
                    )
                    yield decode_case(
                        shapes,
                        num_seqs,
                        context,
                        dtype,
                        gen,
                        device,
                        plan,
                        f" n{block_n} w{num_warps} s{num_stages} p{plan.num_partitions}",
                    )


def timed_cases(shapes: Shapes, dtype, gen, device, sweep: bool, num_sms: int):
    """Built one at a time, so each case's tensors are freed before the next is allocated."""
    yield from elementwise_cases(shapes, dtype, gen, device)
    yield from moe_cases(shapes, dtype, gen, device)
    yield from quantized_cases(shapes, dtype, gen, device)
    for num_seqs, context in shapes.decode_cases:
        yield decode_case(shapes, num_seqs, context, dtype, gen, device)
    for num_seqs, prefix, new in shapes.prefill_cases:
        yield prefill_case(shapes, num_seqs, prefix, new, dtype, gen, device)
    if sweep:
        yield from sweep_cases(shapes, dtype, gen, device, num_sms)


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
    parser = argparse.ArgumentParser(
        prog="python -m inferfleet_runtime.kernels.gpu_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--sweep", action="store_true", help="also time decode tile variants")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        if not is_interpreting():
            print("gpu_check: --cpu-smoke needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        shapes, device, num_sms, iters = SMOKE, torch.device("cpu"), 16, 1
    else:
        if not torch.cuda.is_available():
            print(
                "gpu_check: no CUDA or ROCm GPU is visible to torch; nothing was compiled or measured", file=sys.stderr
            )
            return 2
        if is_interpreting():
            print("gpu_check: TRITON_INTERPRET is set; unset it to compile for the GPU", file=sys.stderr)
            return 2
        shapes, device, iters = Shapes(), torch.device("cuda"), args.iters
        props = torch.cuda.get_device_properties(device)
        num_sms = props.multi_processor_count
        import triton

        print(f"device: {props.name}, {num_sms} SMs, torch {torch.__version__}, triton {triton.__version__}")
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    copy_bw = copy_bandwidth(shapes, iters, device)
    print(
        f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s ({shapes.copy_numel * 2 >> 20} MiB copy, read + write); dtype {args.dtype}"
    )
    header = f"{'kernel case':<44} {'ok':>3} {'max err':>9} {'time us':>9} {'GB/s':>7} {'of copy':>7} {'TFLOP/s':>8}"
    print(header)
    print("-" * len(header))
    num_failed = 0
    for case in timed_cases(shapes, dtype, gen, device, args.sweep, num_sms):
        ok, err = check(case, dtype)
        num_failed += not ok
        ms = median_ms(case.run, iters, device)
        bw = case.num_bytes / (ms / 1e3)
        tflops = f"{case.num_flops / (ms / 1e3) / 1e12:8.1f}" if case.num_flops else f"{'':8}"
        print(
            f"{case.name:<44} {'yes' if ok else 'NO':>3} {err:9.2e} {ms * 1e3:9.1f} {bw / 1e9:7.0f} {bw / copy_bw:7.2f} {tflops}"
        )
    # Correctness in every dtype, fp32 included (its dots run in IEEE fp32, not tf32), on small cases.
    (decode_seqs, decode_context), (prefill_seqs, prefix, new) = shapes.check_cases
    for other in DTYPES.values():
        if device.type == "cpu" and other == torch.bfloat16:
            continue  # the interpreter has no bf16
        for case in (
            decode_case(shapes, decode_seqs, decode_context, other, gen, device),
            prefill_case(shapes, prefill_seqs, prefix, new, other, gen, device),
        ):
            ok, err = check(case, other)
            num_failed += not ok
            print(f"{case.name + ' ' + str(other)[6:]:<44} {'yes' if ok else 'NO':>3} {err:9.2e}")
    print("all checks passed" if not num_failed else f"{num_failed} checks FAILED")
    return 1 if num_failed else 0


if __name__ == "__main__":
    sys.exit(main())
