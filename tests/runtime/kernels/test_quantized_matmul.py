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
