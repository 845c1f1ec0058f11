"""Guarded Triton import and the choice between compiled and interpreted kernels.

Triton decides at decoration time whether `@triton.jit` yields a compiled or an interpreted
function (TRITON_INTERPRET=1). Kernels here are decorated when their module is imported, which
may happen before a test sets the variable; `runnable` therefore re-wraps a compiled kernel's
Python function in the interpreter when the tensors live on the CPU.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the reference backend works without triton
    triton = None
    tl = None

HAS_TRITON = triton is not None

# Kernel parameters are annotated `constexpr`; with postponed annotations triton (compiler and
# interpreter) reads the string "constexpr", and the modules import without triton.
constexpr = tl.constexpr if HAS_TRITON else object


def jit(fn):
    """`triton.jit` when triton is importable; otherwise the plain function (never launched)."""
    return triton.jit(fn) if HAS_TRITON else fn


def is_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def runnable(kernel, device: torch.device):
    """The kernel as launchable for tensors on `device` (`kernel[grid](...)`)."""
    if not HAS_TRITON:
        raise RuntimeError("the triton kernels need the `triton` package; use kernels='reference'")
    if device.type != "cpu":
        return kernel
    if not is_interpreting():
        raise RuntimeError(
            "triton kernels on CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1"
        )
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(kernel, InterpretedFunction):
        return kernel
    return InterpretedFunction(kernel.fn)


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")


def check_dtype(name: str, t: torch.Tensor, dtypes) -> None:
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
