"""Triton rotary embedding matches the torch reference (rotate-half convention, cos/sin cache)."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels import rotary as rope

HEAD_DIMS = [64, 80, 96, 128]
# (num_heads, num_kv_heads)
HEAD_CONFIGS = [(4, 4), (4, 2), (4, 1)]
DTYPES = [torch.float32, torch.float16]
MAX_POSITIONS = 64


def cos_sin_cache(head_dim, base=10000.0, max_positions=MAX_POSITIONS):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def test_reference_rotates_each_pair_by_its_angle():
    # Rotate-half pairs element i with i + D/2 and turns the pair by angle pos * inv_freq[i].
    head_dim, pos = 8, 5
    cache = cos_sin_cache(head_dim)
    q = torch.randn(1, 1, head_dim)
    k = torch.randn(1, 1, head_dim)
    rq, _ = rope.rotary_reference(q, k, torch.tensor([pos]), cache)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    as_complex = torch.complex(q[0, 0, :4], q[0, 0, 4:]) * torch.polar(torch.ones(4), pos * inv_freq)
    torch.testing.assert_close(rq[0, 0], torch.cat((as_complex.real, as_complex.imag)))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEAD_CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference_on_views_into_fused_qkv(head_dim, heads, dtype, tolerance):
    num_heads, num_kv_heads = heads
    num_tokens = 5
    gen = torch.Generator().manual_seed(head_dim)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    query = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.tensor([0, 1, 17, 40, MAX_POSITIONS - 1])
    cache = cos_sin_cache(head_dim)
    before = qkv.clone()
    got_q, got_k = rope.rotary(query, key, positions, cache)
    want_q, want_k = rope.rotary_reference(query, key, positions, cache)
    torch.testing.assert_close(got_q, want_q, **tolerance(dtype))
    torch.testing.assert_close(got_k, want_k, **tolerance(dtype))
    assert torch.equal(qkv, before), "inputs must not be modified"


def test_rejects_cache_of_wrong_width():
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope.rotary(torch.randn(2, 2, 64), torch.randn(2, 1, 64), torch.arange(2), cos_sin_cache(32))
