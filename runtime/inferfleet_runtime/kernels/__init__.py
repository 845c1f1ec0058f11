"""Kernel facade: `get_ops(backend)` gives the model its five hot ops, as torch references or Triton kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import activation, kv_cache, paged_attention, rms_norm, rotary
from ._triton import HAS_TRITON

BACKENDS = ("reference", "triton", "auto")


@dataclass(frozen=True)
class KernelOps:
    """The ops the model calls; see each kernel module for the math and layouts."""

    backend: str  # "reference" or "triton", after resolving "auto"
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable
    write_kv: Callable
    paged_attention: Callable


REFERENCE_OPS = KernelOps(
    backend="reference",
    rms_norm=rms_norm.rms_norm_reference,
    rotary=rotary.rotary_reference,
    silu_and_mul=activation.silu_and_mul_reference,
    write_kv=kv_cache.write_kv_reference,
    paged_attention=paged_attention.paged_attention_reference,
)

TRITON_OPS = KernelOps(
    backend="triton",
    rms_norm=rms_norm.rms_norm,
    rotary=rotary.rotary,
    silu_and_mul=activation.silu_and_mul,
    write_kv=kv_cache.write_kv,
    paged_attention=paged_attention.paged_attention,
)


def has_triton_device() -> bool:
    """True when torch sees a device Triton compiles for (CUDA, ROCm through torch.cuda, or XPU)."""
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def resolve_backend(backend: str) -> str:
    """ "auto" -> "triton" when a Triton device and triton are present, else "reference"."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernels backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "triton" if HAS_TRITON and has_triton_device() else "reference"
    return backend


def get_ops(backend: str = "auto") -> KernelOps:
    """The ops for `backend` ("reference" | "triton" | "auto")."""
    resolved = resolve_backend(backend)
    if resolved == "reference":
        return REFERENCE_OPS
    if not HAS_TRITON:
        raise RuntimeError("kernels='triton' needs the `triton` package, which is not importable here")
    return TRITON_OPS
