"""Triton SiLU-and-mul matches the torch reference."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels import activation

INTERMEDIATE_SIZES = [64, 80, 1500]
NUM_TOKENS = [1, 6]
DTYPES = [torch.float32, torch.float16]


def test_reference_is_silu_of_gate_times_up():
    x = torch.randn(3, 16)
    expected = x[:, :8] * torch.sigmoid(x[:, :8]) * x[:, 8:]
    torch.testing.assert_close(activation.silu_and_mul_reference(x), expected)


@pytest.mark.parametrize("intermediate_size", INTERMEDIATE_SIZES)
@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(intermediate_size, num_tokens, dtype, tolerance):
    x = torch.randn(num_tokens, 2 * intermediate_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    torch.testing.assert_close(activation.silu_and_mul(x), activation.silu_and_mul_reference(x), **tolerance(dtype))


def test_rejects_odd_width():
    with pytest.raises(ValueError, match="2I"):
        activation.silu_and_mul(torch.randn(2, 7))
