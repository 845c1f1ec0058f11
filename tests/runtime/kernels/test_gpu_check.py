"""The GPU check refuses to run without a GPU and its correctness check tells a wrong kernel from a right one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from inferfleet_runtime.kernels import activation, gpu_check


def test_exits_with_a_clear_message_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no CUDA or ROCm GPU" in capsys.readouterr().err


def test_check_accepts_a_matching_kernel_and_rejects_a_wrong_one():
    x = torch.randn(4, 64)
    right = gpu_check.Case("silu", lambda: activation.silu_and_mul(x), lambda: activation.silu_and_mul_reference(x), 1)
    wrong = gpu_check.Case(
        "silu", lambda: activation.silu_and_mul(x) * 1.01, lambda: activation.silu_and_mul_reference(x), 1
    )
    assert gpu_check.check(right, torch.float32)[0]
    assert not gpu_check.check(wrong, torch.float32)[0]


@pytest.mark.slow
def test_harness_runs_end_to_end_on_tiny_cpu_shapes():
    # The GPU check has not run on a GPU; this runs its whole harness (cases, checks, timing, table)
    # through the interpreter so that the script itself is known to work.
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "inferfleet_runtime.kernels.gpu_check", "--cpu-smoke", "--dtype", "float16"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if " yes " in line]
    names = " ".join(rows)
    kernels = (
        "rms_norm+residual",
        "silu_and_mul",
        "rotary",
        "write_kv",
        "fused_experts",
        "quantized_matmul int8",
        "quantized_matmul int4",
        "quantized_matmul fp8",
        "paged decode",
        "paged prefill",
    )
    for kernel in kernels:
        assert kernel in names, result.stdout
    assert "all checks passed" in result.stdout
