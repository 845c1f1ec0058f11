"""PackedLinear (oneDNN's blocked weight layout, what ModelRunner serves with on a CPU) computes nn.Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inferfleet_runtime.layers.linear import PackedLinear, can_pack_linears, pack_linears

pytestmark = pytest.mark.skipif(
    not can_pack_linears(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN linear ops"
)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 32, 130])
def test_packed_linear_equals_nn_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
        # A non-contiguous input (a transposed view) gives the same rows.
        xt = x.t().contiguous().t()
        torch.testing.assert_close(packed(xt), linear(x), rtol=1e-5, atol=1e-5)


def test_pack_linears_replaces_the_large_linears_of_a_float32_cpu_model_only():
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Sequential(nn.Linear(1024, 512, bias=False)))
    model.append(nn.Linear(512, 8))  # 4,096 elements: below PACKED_LINEAR_MIN_WEIGHT, stays nn.Linear
    x = torch.randn(3, 512)
    with torch.inference_mode():
        expected = model(x)
        assert pack_linears(model) == 2
        assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
        assert isinstance(model[3], nn.Linear)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-4)
    assert pack_linears(model) == 0  # nothing left that is large enough
    assert pack_linears(model, min_weight=0) == 1

    half = nn.Sequential(nn.Linear(512, 1024)).to(torch.bfloat16)
    assert pack_linears(half) == 0
    assert isinstance(half[0], nn.Linear)
