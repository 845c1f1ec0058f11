"""Triton KV cache write scatters keys and values to their slots exactly like the torch reference."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels import kv_cache

BLOCK_SIZES = [8, 16]
HEAD_DIMS = [64, 80, 128]
NUM_KV_HEADS = [1, 2]
DTYPES = [torch.float32, torch.float16]


def scattered_slots(num_tokens, num_blocks, block_size, seed=0):
    return torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(seed))[:num_tokens]


def test_reference_writes_each_token_to_its_block_and_offset():
    key_cache = torch.zeros(4, 8, 1, 2)
    value_cache = torch.zeros(4, 8, 1, 2)
    key = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])
    kv_cache.write_kv_reference(key, -key, key_cache, value_cache, torch.tensor([3 * 8 + 5, 0]))
    assert key_cache[3, 5, 0].tolist() == [1.0, 2.0] and key_cache[0, 0, 0].tolist() == [3.0, 4.0]
    assert value_cache[3, 5, 0].tolist() == [-1.0, -2.0]
    assert int((key_cache != 0).sum()) == 4


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("num_kv_heads", NUM_KV_HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(block_size, head_dim, num_kv_heads, dtype):
    num_blocks, num_tokens = 6, 11
    gen = torch.Generator().manual_seed(1)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = scattered_slots(num_tokens, num_blocks, block_size)
    caches = [torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    kv_cache.write_kv(key, value, *caches, slots)
    kv_cache.write_kv_reference(key, value, *expected, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_reads_key_and_value_views_with_token_stride():
    num_kv_heads, head_dim = 2, 64
    kv = torch.randn(5, 2 * num_kv_heads * head_dim)
    key = kv[:, : num_kv_heads * head_dim].view(5, num_kv_heads, head_dim)
    value = kv[:, num_kv_heads * head_dim :].view(5, num_kv_heads, head_dim)
    caches = [torch.zeros(2, 8, num_kv_heads, head_dim) for _ in range(2)]
    expected = [c.clone() for c in caches]
    slots = torch.tensor([15, 0, 7, 8, 3])
    kv_cache.write_kv(key, value, *caches, slots)
    kv_cache.write_kv_reference(key, value, *expected, slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def test_writes_slots_in_blocks_beyond_16_bits():
    num_blocks, block_size, head_dim = (1 << 16) + 8, 8, 16
    caches = [torch.zeros(num_blocks, block_size, 1, head_dim, dtype=torch.float16) for _ in range(2)]
    slots = torch.tensor([(num_blocks - 1) * block_size + 7, (1 << 16) * block_size + 2, 5])
    key = torch.randn(3, 1, head_dim).half()
    kv_cache.write_kv(key, 2 * key, *caches, slots)
    assert torch.equal(caches[0][num_blocks - 1, 7], key[0]) and torch.equal(caches[0][1 << 16, 2], key[1])
    assert torch.equal(caches[1][0, 5], 2 * key[2])


def test_rejects_slot_mapping_of_wrong_length():
    caches = [torch.zeros(2, 8, 1, 16) for _ in range(2)]
    with pytest.raises(ValueError, match="slot_mapping"):
        kv_cache.write_kv(torch.randn(3, 1, 16), torch.randn(3, 1, 16), *caches, torch.tensor([0, 1]))
