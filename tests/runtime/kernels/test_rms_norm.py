"""Triton fused RMSNorm (with and without residual add) matches the torch reference."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels import rms_norm as rn

HIDDEN_SIZES = [64, 80, 96, 1000]
NUM_TOKENS = [1, 7]
DTYPES = [torch.float32, torch.float16]
EPS = 1e-5


def inputs(num_tokens, hidden_size, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden_size, generator=gen).to(dtype)
    residual = torch.randn(num_tokens, hidden_size, generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden_size, generator=gen)).to(dtype)
    return x, residual, weight


def test_reference_matches_rms_formula():
    x, _, weight = inputs(3, 64, torch.float32)
    out, residual_out = rn.rms_norm_reference(x, weight, EPS)
    expected = x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) / 64 + EPS) * weight
    torch.testing.assert_close(out, expected)
    assert residual_out is x


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_residual", [False, True])
def test_matches_reference(hidden_size, num_tokens, dtype, has_residual, tolerance):
    x, residual, weight = inputs(num_tokens, hidden_size, dtype)
    residual = residual if has_residual else None
    out, residual_out = rn.rms_norm(x, weight, EPS, residual)
    expected_out, expected_residual = rn.rms_norm_reference(x, weight, EPS, residual)
    torch.testing.assert_close(out, expected_out, **tolerance(dtype))
    torch.testing.assert_close(residual_out, expected_residual, **tolerance(dtype))


def test_reads_rows_with_a_stride():
    base = torch.randn(4, 128)
    x = base[:, :64]  # row stride 128
    weight = torch.randn(64)
    torch.testing.assert_close(rn.rms_norm(x, weight, EPS)[0], rn.rms_norm_reference(x, weight, EPS)[0])


def test_rejects_weight_of_wrong_size():
    with pytest.raises(ValueError, match="weight"):
        rn.rms_norm(torch.randn(2, 64), torch.randn(32), EPS)
