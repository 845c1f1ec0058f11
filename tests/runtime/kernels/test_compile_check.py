"""Every kernel variant compiles with Triton's GPU compiler for NVIDIA Hopper and AMD CDNA3, on a CPU machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_kernels_compile_to_cubin_and_hsaco_including_bf16(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    cmd = [
        sys.executable,
        "-m",
        "inferfleet_runtime.kernels.compile_check",
        "--quick",
        "--head-dim",
        "80",
        "--dtype",
        "bfloat16",
        "--target",
        "cuda:90",
        "--target",
        "hip:gfx942",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for target in ("cuda:90", "hip:gfx942"):
        compiled = {line.split()[-6] for line in lines if line.startswith(f"ok   {target} ")}
        assert compiled == {
            "_rms_norm_kernel",
            "_silu_and_mul_kernel",
            "_rotary_kernel",
            "_write_kv_kernel",
            "_paged_attention_kernel",
            "_reduce_partitions_kernel",
            "_fused_moe_kernel",
            "_quantized_matmul_kernel",
        }, result.stdout
        # int8, FP8 (bytes decoded in registers: no FP8 hardware needed), int4, int4 with zero points and offsets
        assert sum(f"ok   {target} bfloat16 quantized_matmul " in line for line in lines) == 4, result.stdout


@pytest.mark.slow
def test_refuses_to_run_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "inferfleet_runtime.kernels.compile_check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2 and "TRITON_INTERPRET is set" in result.stderr
