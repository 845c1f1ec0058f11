"""Lazy Triton: kernels are `triton.jit`-ed at first launch, so importing the package never imports triton.

Triton fixes at decoration time whether `triton.jit` yields a compiled or an interpreted
(TRITON_INTERPRET=1) function, and its standard library (`tl.zeros`, `tl.max`, ...) is decorated
when `triton` is first imported. Deferring both to the first launch lets a process (a test) set
TRITON_INTERPRET=1 after importing the runtime and still run the kernels on CPU tensors.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from inferfleet_runtime.model_config import DTYPES

HAS_TRITON = importlib.util.find_spec("triton") is not None

# The floating-point dtypes every kernel takes: the runtime's dtype table.
FLOAT_DTYPES = tuple(DTYPES.values())


def is_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


class TritonKernel:
    """A kernel function; `on(device)` gives the `triton.jit` function to launch as `[grid](...)`.

    The kernel body refers to `tl`; it is bound to `triton.language` in the kernel's module at first
    launch (a deferred import). Parameters annotated `tl.constexpr` (a string under postponed annotations) are compile-time constants.
    """

    def __init__(self, fn):
        self.fn = fn
        self._jitted: dict[bool, object] = {}  # keyed by "interpreted"

    def on(self, device: torch.device):
        if not HAS_TRITON:
            raise RuntimeError("the triton kernels need the `triton` package; use kernels='reference'")
        interpret = is_interpreting()
        if device.type == "cpu" and not interpret:
            raise RuntimeError(
                "triton kernels on CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1"
            )
        if interpret not in self._jitted:
            import triton
            import triton.language as tl

            if interpret:
                check_interpreter_ready()
            self.fn.__globals__["tl"] = tl
            self._jitted[interpret] = triton.jit(self.fn)
        return self._jitted[interpret]


def triton_kernel(fn) -> TritonKernel:
    """Marks a Triton kernel (the `triton.jit` decorator, applied at first launch)."""
    return TritonKernel(fn)


def check_interpreter_ready() -> None:
    """Raises when triton was imported before TRITON_INTERPRET=1 was set (its library is compiled-only)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.standard.zeros, InterpretedFunction):
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so its library cannot be interpreted; "
            "set TRITON_INTERPRET=1 in the environment before the process imports triton"
        )


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
