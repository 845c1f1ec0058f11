"""The tensorrt backend: a clear refusal where TensorRT or an NVIDIA GPU is missing; parity where both exist."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from inferfleet_runtime.cli import main

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_NVIDIA_GPU = torch.cuda.is_available() and not getattr(torch.version, "hip", None)
MISSING = ", ".join(what for what, ok in (("TensorRT is not installed", HAS_TENSORRT),
                                          ("no NVIDIA CUDA GPU", HAS_NVIDIA_GPU)) if not ok)


@pytest.mark.skipif(not MISSING, reason="TensorRT and an NVIDIA GPU are present: the build is tested instead")
def test_tensorrt_build_without_tensorrt_or_gpu_exits_2_with_the_reason(demo_model_dir, tmp_path, capsys):
    code = main(["compile", "--model", str(demo_model_dir), "--out", str(tmp_path / "e"), "--backend", "tensorrt",
                 "--max-context-length", "64", "--max-batch-size", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    expected = "needs an NVIDIA CUDA GPU" if not HAS_NVIDIA_GPU else "needs TensorRT"
    assert expected in err and "--backend aotinductor" in err
    assert not (tmp_path / "e").exists()


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=f"tensorrt path needs TensorRT and an NVIDIA GPU: {MISSING}")
def test_tensorrt_engine_matches_the_paged_engine(demo_model_dir, tmp_path):
    from inferfleet_runtime.compiled.gpu_check import compare_with_paged

    out = tmp_path / "trt"
    assert main(["compile", "--model", str(demo_model_dir), "--out", str(out), "--backend", "tensorrt",
                 "--max-context-length", "64", "--max-batch-size", "4", "--dtype", "float32",
                 "--decode-buckets", "2,4", "--prefill-buckets", "16"]) == 0
    compiled_tokens, paged_tokens = compare_with_paged(demo_model_dir, out, device="cuda")
    assert compiled_tokens == paged_tokens
