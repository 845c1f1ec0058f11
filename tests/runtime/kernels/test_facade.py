"""get_ops picks the reference, Triton or native backend; the Triton kernels run on CPU only under the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import inferfleet_runtime.kernels as kernels
from inferfleet_runtime.kernels import get_ops

OP_NAMES = ["rms_norm", "rotary", "silu_and_mul", "write_kv", "paged_attention"]


def test_reference_backend_uses_the_torch_references():
    ops = get_ops("reference")
    assert ops.backend == "reference"
    assert ops.paged_attention is kernels.paged_attention.paged_attention_reference
    assert all(callable(getattr(ops, name)) for name in OP_NAMES)


def test_triton_backend_uses_the_launchers():
    ops = get_ops("triton")
    assert ops.backend == "triton"
    assert ops.paged_attention is kernels.paged_attention.paged_attention
    assert ops.rms_norm is kernels.rms_norm.rms_norm


def test_auto_picks_reference_without_a_triton_device_or_native_kernels(monkeypatch):
    monkeypatch.setattr(kernels, "has_triton_device", lambda: False)
    monkeypatch.setattr(kernels.native, "library", lambda: None)
    assert get_ops("auto").backend == "reference"


def test_auto_keeps_a_cpu_model_off_the_triton_device(monkeypatch):
    monkeypatch.setattr(kernels, "has_triton_device", lambda: True)
    monkeypatch.setattr(kernels.native, "library", lambda: None)
    assert get_ops("auto", torch.float32, torch.device("cpu")).backend == "reference"


def test_auto_picks_triton_on_a_triton_device(monkeypatch):
    monkeypatch.setattr(kernels, "has_triton_device", lambda: True)
    assert get_ops("auto").backend == "triton"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown kernels backend 'cuda'"):
        get_ops("cuda")


def test_cpu_launch_without_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        get_ops("triton").silu_and_mul(torch.randn(2, 8))


def test_cpu_launch_runs_through_the_interpreter():
    from triton.runtime.interpreter import InterpretedFunction

    x = torch.randn(2, 8)
    torch.testing.assert_close(get_ops("triton").silu_and_mul(x), get_ops("reference").silu_and_mul(x))
    assert isinstance(kernels.activation._silu_and_mul_kernel.on(x.device), InterpretedFunction)


@pytest.mark.slow
def test_triton_imported_before_the_interpreter_flag_gives_a_clear_error():
    code = (
        "import os, torch, triton\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "from inferfleet_runtime.kernels import get_ops\n"
        "try:\n    get_ops('triton').silu_and_mul(torch.randn(2, 8))\n"
        "except RuntimeError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "imported before TRITON_INTERPRET=1" in result.stdout, result.stderr


@pytest.mark.slow
def test_importing_the_kernels_does_not_import_triton():
    code = "import sys, inferfleet_runtime.kernels as k; k.get_ops('reference'); print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
