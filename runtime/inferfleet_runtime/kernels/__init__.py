"""Kernel facade: `get_ops(backend)` gives the model its hot ops, as torch references, Triton kernels (GPUs) or
native C kernels (float32 on a CPU, kernels/native.py). The native backend has no fused-experts kernel: it runs the
torch CPU path of kernels/fused_moe.py (a Mixture-of-Experts model logs that at load)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import activation, fused_moe, kv_cache, native, paged_attention, quantized_matmul, rms_norm, rotary
from ._triton import HAS_TRITON

BACKENDS = ("reference", "triton", "native", "auto")


@dataclass(frozen=True)
class KernelOps:
    """The ops the model calls; see each kernel module for the math and layouts."""

    backend: str  # "reference", "triton" or "native", after resolving "auto"
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable
    write_kv: Callable
    paged_attention: Callable
    fused_experts: Callable  # the experts of a sparse MoE layer (kernels/fused_moe.py)
    # Weight-only int8/int4 matmul (kernels/quantized_matmul.py) for layers.quantized.QuantizedLinear; None: the
    # layer's own torch reference (the native backend packs those layers for native.c instead, layers.linear).
    quantized_matmul: Callable | None = None


REFERENCE_OPS = KernelOps(
    backend="reference",
    rms_norm=rms_norm.rms_norm_reference,
    rotary=rotary.rotary_reference,
    silu_and_mul=activation.silu_and_mul_reference,
    write_kv=kv_cache.write_kv_reference,
    paged_attention=paged_attention.paged_attention_reference,
    fused_experts=fused_moe.fused_experts_reference,
)

TRITON_OPS = KernelOps(
    backend="triton",
    rms_norm=rms_norm.rms_norm,
    rotary=rotary.rotary,
    silu_and_mul=activation.silu_and_mul,
    write_kv=kv_cache.write_kv,
    paged_attention=paged_attention.paged_attention,
    fused_experts=fused_moe.fused_experts,
    quantized_matmul=quantized_matmul.quantized_matmul,
)

NATIVE_OPS = KernelOps(
    backend="native",
    rms_norm=native.rms_norm,
    rotary=native.rotary,
    silu_and_mul=native.silu_and_mul,
    write_kv=native.write_kv,
    paged_attention=native.paged_attention,
    fused_experts=fused_moe.fused_experts_reference,
)


def has_triton_device() -> bool:
    """True when torch sees a device Triton compiles for (CUDA, ROCm through torch.cuda, or XPU)."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def resolve_backend(backend: str, dtype: torch.dtype | None = None, device: torch.device | None = None) -> str:
    """ "auto" -> "triton" when a Triton device and triton are present (and the model is not placed on the CPU);
    else "native" for a float32 (or unstated) model when the native kernels build here; else "reference"."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    on_cpu = device is not None and device.type == "cpu"
    if not on_cpu and HAS_TRITON and has_triton_device():
        return "triton"
    if (device is None or on_cpu) and dtype in (None, torch.float32) and native.library() is not None:
        return "native"
    return "reference"


def get_ops(backend: str = "auto", dtype: torch.dtype | None = None, device: torch.device | None = None) -> KernelOps:
    """The ops for `backend` ("reference" | "triton" | "native" | "auto") and a model of `dtype` on `device`."""
    resolved = resolve_backend(backend, dtype, device)
    if resolved == "reference":
        return REFERENCE_OPS
    if resolved == "native":
        if dtype not in (None, torch.float32) or (device is not None and device.type != "cpu"):
            raise ValueError(f"kernels='native' runs float32 models on a CPU, not {dtype} on {device}")
        if native.library() is None:
            raise RuntimeError(native.unavailable_reason())
        return NATIVE_OPS
    if not HAS_TRITON:
        raise RuntimeError("kernels='triton' needs the `triton` package, which is not importable here")
    return TRITON_OPS
