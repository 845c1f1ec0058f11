"""Triton weight-only int8 / int4 matmul matches its torch reference, which matches QuantizedLinear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferfleet_runtime.kernels import quantized_matmul as qm
from inferfleet_runtime.layers.quantized import QuantizedLinear

# (bits, group size, K, N, zeros, offsets): N ending inside a tile, K not a multiple of the K tile (32), group 2.
SHAPES = [(8, 48, 48, 40, False, False), (8, 16, 64, 33, True, False), (4, 32, 64, 32, False, False),
          (4, 8, 72, 20, True, True), (4, 2, 6, 5, False, True)]  # fmt: skip


def quantized(bits, group_size, k, n, zeros, offsets):
    torch.manual_seed(k * n + bits)
    layer = QuantizedLinear(k, n, bits, group_size, True, zeros, has_offsets=offsets)
    ref = QuantizedLinear.from_float(nn.Linear(k, n), bits, group_size)
    layer.qweight.copy_(ref.qweight)
    layer.scales.copy_(ref.scales)
    layer.bias.copy_(torch.randn(n))
    if zeros:
        layer.zeros.copy_(torch.randint(-3, 3, layer.zeros.shape, dtype=torch.int8))
    if offsets:
        layer.offsets.copy_(torch.randn(layer.offsets.shape) * 0.05)
    return layer


def args_of(layer):
    return (layer.qweight, layer.scales, layer.zeros, layer.offsets, layer.bits, layer.group_size, layer.bias)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_equals_quantized_linear(shape):
    layer = quantized(*shape)
    x = torch.randn(5, layer.in_features)
    torch.testing.assert_close(qm.quantized_matmul_reference(x, *args_of(layer)), layer(x))


@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(shape, rows, tolerance):
    layer = quantized(*shape)
    x = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows))
    expected = qm.quantized_matmul_reference(x, *args_of(layer))
    torch.testing.assert_close(qm.quantized_matmul(x, *args_of(layer)), expected, **tolerance(torch.float32))


def test_fp16_activations(tolerance):
    layer = quantized(4, 32, 64, 32, True, False)
    x = torch.randn(3, 64).half()
    got = qm.quantized_matmul(x, *args_of(layer))
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, qm.quantized_matmul_reference(x, *args_of(layer)), **tolerance(torch.float16))


def test_refuses_a_weight_for_another_width():
    layer = quantized(4, 32, 64, 32, False, False)
    with pytest.raises(ValueError, match="does not take x of 96 columns"):
        qm.quantized_matmul(torch.randn(2, 96), *args_of(layer))


def test_fp8_bytes_decode_to_the_floats_torch_reads():
    """Every float8_e4m3fn byte (subnormals, both zeros, NaN) comes out of the kernel as torch's own conversion:
    x = [1, 0] picks each weight row's first column."""
    every_byte = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    weight = every_byte.view(256, 1).repeat(1, 2).contiguous()
    got = qm.quantized_matmul(torch.tensor([[1.0, 0.0]]), weight, torch.ones(256, 1), None, None, 8, 2)[0]
    expected = every_byte.float()
    assert torch.equal(got.isnan(), expected.isnan()) and expected.isnan().sum() == 2
    assert torch.equal(got[~got.isnan()], expected[~expected.isnan()])


def fp8_layer(k, n, dtype=torch.float32):
    torch.manual_seed(k + n)
    layer = QuantizedLinear(k, n, 8, k, True, dtype=dtype, fp8=True)
    layer.qweight.copy_((torch.randn(n, k) * 40).to(torch.float8_e4m3fn))
    layer.scales.copy_(torch.rand(n, 1) * 0.01 + 0.001)
    layer.bias.copy_(torch.randn(n))
    return layer


@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("k, n", [(48, 40), (64, 33)])
def test_fp8_weights_match_the_reference_and_the_layer(k, n, rows, tolerance):
    layer = fp8_layer(k, n)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    expected = qm.quantized_matmul_reference(x, *args_of(layer))
    torch.testing.assert_close(expected, layer(x))  # the layer's own dequantizing forward
    torch.testing.assert_close(qm.quantized_matmul(x, *args_of(layer)), expected, **tolerance(torch.float32))
    half = fp8_layer(k, n, torch.float16)
    got = qm.quantized_matmul(x.half(), *args_of(half))
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, qm.quantized_matmul_reference(x.half(), *args_of(half)), **tolerance(torch.float16))


def test_fp8_layers_refuse_other_widths_and_zero_points():
    with pytest.raises(ValueError, match="not 4 bits"):
        QuantizedLinear(64, 8, 4, 64, fp8=True)
    with pytest.raises(ValueError, match="FP8 weights are 8-bit"):
        qm.quantized_matmul(torch.randn(1, 8), torch.zeros(4, 8, dtype=torch.float8_e4m3fn), torch.ones(4, 1), None,
                            None, 4, 8)  # fmt: skip


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_an_fp8_checkpoint_stays_fp8_under_the_triton_kernels_and_greedy_agrees(tiny_llama_factory, tmp_path, strategy):
    """A compressed-tensors FP8 checkpoint (made by the package) served by the Triton backend keeps its weights as
    FP8 bytes and answers as the dequantized model and as transformers running the package's decompression."""
    from inferfleet_runtime.checkpoints.loader import load_model

    from ..support.compressed_checkpoints import NUM_NEW_TOKENS, PROMPTS, hf_greedy, make_compressed
    from ..support.paged_greedy import greedy_paged

    pytest.importorskip("compressed_tensors")  # the checkpoint is made by the compressed-tensors package

    float_dir = tiny_llama_factory("compressed-float")
    model_dir, hf = make_compressed(float_dir, tmp_path / "fp8", 8, None, True, "float-quantized", "float", strategy)
    kept = load_model(model_dir, kernels="triton").model
    dequantized = load_model(model_dir, kernels="reference").model
    layer = kept.layers[1].self_attn.qkv_proj
    assert isinstance(layer, QuantizedLinear) and layer.qweight.dtype == torch.float8_e4m3fn
    assert layer.scales.shape == (layer.out_features, 1)
    float_qkv = dequantized.layers[1].self_attn.qkv_proj.weight  # fused parts keep their own per-tensor scales
    torch.testing.assert_close(layer.dequantize(), float_qkv, rtol=0, atol=0)
    x = torch.randn(3, layer.in_features)
    torch.testing.assert_close(layer(x), x @ float_qkv.T, rtol=2e-5, atol=2e-5)
    assert greedy_paged(kept, PROMPTS, NUM_NEW_TOKENS, 4, 5) == hf_greedy(hf)
