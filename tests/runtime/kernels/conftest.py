"""Kernel tests run the Triton kernels on the CPU under the Triton interpreter; tolerances live here."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels._triton import HAS_TRITON

# TRITON_INTERPRET=1 is set by tests/conftest.py, before any test module can import triton.

# One table for every kernel comparison against its torch reference. The interpreter evaluates
# the kernels with numpy; fp16 error comes from rounding P to fp16 before the P @ V product and
# from the different accumulation order of the online softmax.
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


@pytest.fixture
def tolerance():
    """tolerance(dtype) -> kwargs for torch.testing.assert_close."""
    return lambda dtype: TOLERANCES[dtype]


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """Launches every Triton kernel through the interpreter (CPU tensors, no GPU)."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
