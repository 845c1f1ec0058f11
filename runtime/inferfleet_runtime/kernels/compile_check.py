"""Compile check without a GPU: builds every kernel variant the launchers produce for a GPU target.

    python -m inferfleet_runtime.kernels.compile_check [--target cuda:90] [--dtype bfloat16 ...] [--quick]

Runs each launcher on tiny CPU tensors with the kernels' `on(device)` replaced by a recorder, then
compiles each recorded launch (signature, constexprs, num_warps/num_stages) with
`triton.compile(ASTSource(...), target=GPUTarget(...))` down to the device binary (cubin for CUDA,
hsaco for ROCm). It proves the kernels pass Triton's compiler for that target, including bf16, which
the interpreter cannot run; it does not run them (that is gpu_check's job on a GPU).
Must run with TRITON_INTERPRET unset, in a process that has not imported triton in interpreter mode.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass

import torch

from inferfleet_runtime.model_config import DTYPES

from . import _triton, activation, fused_moe, kv_cache, paged_attention, quantized_matmul, rms_norm, rotary

POINTER_TYPES = {
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.float32: "*fp32",
    torch.int32: "*i32",
    torch.int8: "*i8",
    torch.uint8: "*u8",
    torch.int64: "*i64",
}
LAUNCH_OPTIONS = ("num_warps", "num_stages")


@dataclass(frozen=True)
class Launch:
    label: str
    kernel: _triton.TritonKernel
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def recording(launches: list[Launch], label: str):
    """Within the block, kernel launches are appended to `launches` instead of running."""

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(Launch(label, self.kernel, args, kwargs))

    original = _triton.TritonKernel.on
    _triton.TritonKernel.on = lambda self, device: Recorder(self)
    try:
        yield
    finally:
        _triton.TritonKernel.on = original


def record_variants(dtype, head_dims, quick: bool) -> list[Launch]:
    """Launches of every op; attention in decode, split-KV decode and prefill for each head shape, and the latter
    two with a sliding window; the fused experts with decode- and prefill-sized blocks (Mixtral-8x7B's widths)."""
    launches: list[Launch] = []
    z = lambda *shape: torch.zeros(shape, dtype=dtype)  # noqa: E731
    with recording(launches, "rms_norm"):
        rms_norm.rms_norm(z(2, 4096), z(4096), 1e-5)
        rms_norm.rms_norm(z(2, 4096), z(4096), 1e-5, z(2, 4096))
    with recording(launches, "silu_and_mul"):
        activation.silu_and_mul(z(2, 2 * 14336))
    # Mixtral-8x7B's widths, two of its experts (weights left unwritten: nothing runs), top-2.
    w_gate_up, w_down = torch.empty(2, 2 * 14336, 4096, dtype=dtype), torch.empty(2, 4096, 14336, dtype=dtype)
    for num_tokens in (1, 64):  # 16- and 64-row blocks (fused_moe.block_sizes)
        with recording(launches, f"fused_experts {num_tokens} tokens"):
            ids = torch.tensor([[0, 1]] * num_tokens)
            fused_moe.fused_experts(z(num_tokens, 4096), w_gate_up, w_down, torch.full((num_tokens, 2), 0.5), ids)
    with recording(launches, "rotary"):
        rotary.rotary(z(2, 32, 128), z(2, 8, 128), torch.zeros(2, dtype=torch.int64), torch.zeros(16, 128))
    with recording(launches, "write_kv"):
        kv_cache.write_kv(
            z(2, 8, 128), z(2, 8, 128), z(4, 16, 8, 128), z(4, 16, 8, 128), torch.zeros(2, dtype=torch.int64)
        )
    with recording(launches, "quantized_matmul"):
        x, scales, bias = z(2, 4096), z(1024, 32), z(1024)
        int8_weight = torch.zeros(1024, 4096, dtype=torch.int8)
        quantized_matmul.quantized_matmul(x, int8_weight, z(1024, 1), None, None, 8, 4096)
        fp8_weight = torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn)
        quantized_matmul.quantized_matmul(x, fp8_weight, z(1024, 1), None, None, 8, 4096, bias)
        int4_weight = torch.zeros(1024, 2048, dtype=torch.uint8)
        quantized_matmul.quantized_matmul(x, int4_weight, scales, None, None, 4, 128, bias)
        zeros = torch.zeros(1024, 32, dtype=torch.int8)
        quantized_matmul.quantized_matmul(x, int4_weight, scales, zeros, scales, 4, 128)
    groups = [(32, 8)] if quick else [(32, 32), (32, 8), (32, 1)]
    for head_dim in head_dims:
        for num_heads, num_kv_heads in groups:
            name = f"attention d{head_dim} h{num_heads}kv{num_kv_heads}"
            caches = (z(8, 16, num_kv_heads, head_dim), z(8, 16, num_kv_heads, head_dim))
            block_tables = torch.zeros(2, 8, dtype=torch.int32)
            seq_lens = torch.tensor([100, 7], dtype=torch.int32)
            query = z(2, num_heads, head_dim)
            with recording(launches, name + " decode"):
                paged_attention.paged_attention(
                    query, *caches, block_tables, seq_lens, 0.1, num_splits=1, max_seq_len=100
                )
            with recording(launches, name + " split decode"):
                paged_attention.paged_attention(
                    query, *caches, block_tables, seq_lens, 0.1, num_splits=4, max_seq_len=100
                )
            with recording(launches, name + " prefill"):
                starts = torch.tensor([0, 50, 57], dtype=torch.int32)
                paged_attention.paged_attention(
                    z(57, num_heads, head_dim),
                    *caches,
                    block_tables,
                    seq_lens,
                    0.1,
                    query_start_loc=starts,
                    max_query_len=50,
                    max_seq_len=100,
                )
            with recording(launches, name + " windowed split decode"):
                paged_attention.paged_attention(
                    query, *caches, block_tables, seq_lens, 0.1, num_splits=4, max_seq_len=100, window=33
                )
            with recording(launches, name + " windowed prefill"):
                paged_attention.paged_attention(
                    z(57, num_heads, head_dim),
                    *caches,
                    block_tables,
                    seq_lens,
                    0.1,
                    query_start_loc=torch.tensor([0, 50, 57], dtype=torch.int32),
                    max_query_len=50,
                    max_seq_len=100,
                    window=33,
                )
    return launches


def signature_of(jit_fn, launch: Launch) -> tuple[dict, dict, dict]:
    signature, constexprs = {}, {}
    for name, value in zip(jit_fn.arg_names, launch.args):
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{launch.label}: argument {name} of type {type(value).__name__}")
    options = {k: v for k, v in launch.kwargs.items() if k in LAUNCH_OPTIONS}
    for name, value in launch.kwargs.items():
        if name not in LAUNCH_OPTIONS:
            signature[name] = "constexpr"
            constexprs[name] = value
    return {name: signature[name] for name in jit_fn.arg_names}, constexprs, options


def compile_launch(launch: Launch, target):
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    launch.kernel.fn.__globals__["tl"] = tl
    jit_fn = triton.jit(launch.kernel.fn)
    signature, constexprs, options = signature_of(jit_fn, launch)
    return triton.compile(ASTSource(jit_fn, signature, constexprs), target=target, options=options)


def parse_target(text: str):
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"target must be cuda:<sm, e.g. 90> or hip:<gfx arch, e.g. gfx942>, got {text!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferfleet_runtime.kernels.compile_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", action="append", help="cuda:90 (default), cuda:80, hip:gfx942, ...")
    parser.add_argument("--dtype", action="append", choices=list(DTYPES))
    parser.add_argument("--head-dim", type=int, action="append")
    parser.add_argument("--quick", action="store_true", help="one GQA shape per head dim")
    args = parser.parse_args(argv)
    if not _triton.HAS_TRITON:
        print("compile_check: triton is not installed", file=sys.stderr)
        return 2
    if _triton.is_interpreting():
        print("compile_check: TRITON_INTERPRET is set; unset it to compile for a GPU target", file=sys.stderr)
        return 2
    try:
        targets = [parse_target(t) for t in args.target or ["cuda:90"]]
    except ValueError as e:
        print(f"compile_check: {e}", file=sys.stderr)
        return 2
    num_failed = 0
    for target in targets:
        for dtype_name in args.dtype or ["bfloat16", "float16"]:
            for launch in record_variants(DTYPES[dtype_name], args.head_dim or [64, 80, 128], args.quick):
                started = time.perf_counter()
                try:
                    compiled = compile_launch(launch, target)
                except Exception as e:  # report every failing variant, not only the first
                    num_failed += 1
                    print(
                        f"FAIL {target.backend}:{target.arch} {dtype_name} {launch.label} {launch.kernel.fn.__name__}: "
                        f"{str(e).splitlines()[-1] if str(e) else type(e).__name__}"
                    )
                    continue
                print(
                    f"ok   {target.backend}:{target.arch} {dtype_name} {launch.label:<36} {launch.kernel.fn.__name__:<28} "
                    f"shared {compiled.metadata.shared:>6} B  {time.perf_counter() - started:5.1f} s"
                )
    print("all variants compiled" if not num_failed else f"{num_failed} variants FAILED to compile")
    return 1 if num_failed else 0


if __name__ == "__main__":
    sys.exit(main())
