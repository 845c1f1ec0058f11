"""The tensorrt backend: a clear refusal where TensorRT or an NVIDIA GPU is missing; parity where both exist."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from inferfleet_runtime.cli import main

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_NVIDIA_GPU = torch.cuda.is_available() and not getattr(torch.version, "hip", None)
MISSING = ", ".join(
    what for what, ok in (("TensorRT is not installed", HAS_TENSORRT), ("no NVIDIA CUDA GPU", HAS_NVIDIA_GPU)) if not ok
)


@pytest.mark.skipif(not MISSING, reason="TensorRT and an NVIDIA GPU are present: the build is tested instead")
def test_tensorrt_build_without_tensorrt_or_gpu_exits_2_with_the_reason(demo_model_dir, tmp_path, capsys):
    code = main(
        [
            "compile",
            "--model",
            str(demo_model_dir),
            "--out",
            str(tmp_path / "e"),
            "--backend",
            "tensorrt",
            "--max-context-length",
            "64",
            "--max-batch-size",
            "2",
        ]
    )
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
    assert (
        main(
            [
                "compile",
                "--model",
                str(demo_model_dir),
                "--out",
                str(out),
                "--backend",
                "tensorrt",
                "--max-context-length",
                "64",
                "--max-batch-size",
                "4",
                "--dtype",
                "float32",
                "--decode-buckets",
                "2,4",
                "--prefill-buckets",
                "16",
            ]
        )
        == 0
    )
    compiled_tokens, paged_tokens = compare_with_paged(demo_model_dir, out, device="cuda")
    assert compiled_tokens == paged_tokens


HAS_ONNX = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript", "onnxruntime"))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ONNX, reason="the ONNX check needs onnx, onnxscript and onnxruntime (dev extra)")
def test_step_exports_to_onnx_that_computes_what_torch_does(demo_model_dir, tmp_path):
    """The TensorRT backend builds from this ONNX export; onnxruntime runs it here on the CPU."""
    import onnxruntime

    from inferfleet_runtime.checkpoints.loader import load_model
    from inferfleet_runtime.compiled.backends.tensorrt import INPUT_NAMES, export_onnx
    from inferfleet_runtime.compiled.step import StaticStep

    loaded = load_model(demo_model_dir, kernels="reference", device="cpu")
    c = loaded.config
    step = StaticStep(loaded.model, 64).eval()
    generator = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(c.num_layers, 2, 4, 64, c.num_kv_heads, c.head_dim, generator=generator)
    # Four decode rows at different positions and slots: row 3 is padding (its K/V are dropped by the runner).
    inputs = (
        torch.tensor([[5], [17], [30], [0]]),
        torch.tensor([3, 10, 63, 0]),
        torch.ones(4, dtype=torch.int64),
        torch.tensor([2, 0, 3, 0]),
        kv_cache,
    )
    export_onnx(step, inputs, tmp_path / "step.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "step.onnx"))
    logits, new_kv = session.run(None, {name: t.numpy() for name, t in zip(INPUT_NAMES, inputs)})
    with torch.no_grad():
        want_logits, want_kv = step(*inputs)
    torch.testing.assert_close(torch.from_numpy(logits), want_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_numpy(new_kv), want_kv, rtol=1e-4, atol=1e-4)
