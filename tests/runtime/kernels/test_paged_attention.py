"""Triton paged attention (decode, varlen prefill/extend, split-KV) matches the torch reference."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.kernels import paged_attention as pa

from ..support.paged_batches import (
    DECODE_SEQ_LENS,
    VARLEN_BATCH,
    WINDOWS,
    dense_causal_attention,
    gather_sequence,
    make_paged_batch,
    varlen_query,
)

BLOCK_SIZES = [8, 16]
HEAD_DIMS = [64, 80, 96, 128]
# (num_heads, num_kv_heads): GQA ratios 1, 2, 4 and MQA.
HEAD_CONFIGS = [(4, 4), (4, 2), (8, 2), (4, 1)]
DTYPES = [torch.float32, torch.float16]
# Split-KV decode: (seq_lens, num_splits).
SPLIT_CASES = [([5, 70, 130], 4), ([128, 3, 200], 7), ([257], 128)]


def grid_cases():
    """Every head dim x head config, each with both dtypes; block sizes alternate through the grid."""
    cases = []
    for i, head_dim in enumerate(HEAD_DIMS):
        for j, heads in enumerate(HEAD_CONFIGS):
            for dtype in DTYPES:
                cases.append(
                    pytest.param(
                        BLOCK_SIZES[(i + j) % 2],
                        head_dim,
                        heads,
                        dtype,
                        id=f"bs{BLOCK_SIZES[(i + j) % 2]}-d{head_dim}-h{heads[0]}kv{heads[1]}-{str(dtype)[6:]}",
                    )
                )
    return cases


@pytest.mark.parametrize("window", [None, *WINDOWS])
def test_reference_matches_dense_causal_attention_per_sequence(window):
    block_size, (num_heads, num_kv_heads), head_dim = 8, (4, 2), 16
    seq_lens = [s for s, _ in VARLEN_BATCH]
    key_cache, value_cache, block_tables, seq_lens_t = make_paged_batch(
        seq_lens, block_size, num_kv_heads, head_dim, torch.float32
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, torch.float32)
    out = pa.paged_attention_reference(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens_t,
        0.3,
        query_start_loc=query_start_loc,
        max_query_len=max_q,
        window=window,
    )
    for b, (seq_len, _) in enumerate(VARLEN_BATCH):
        rows = slice(int(query_start_loc[b]), int(query_start_loc[b + 1]))
        k = gather_sequence(key_cache, block_tables[b], seq_len, block_size)
        v = gather_sequence(value_cache, block_tables[b], seq_len, block_size)
        torch.testing.assert_close(out[rows], dense_causal_attention(query[rows], k, v, 0.3, window))


@pytest.mark.parametrize("block_size, head_dim, heads, dtype", grid_cases())
def test_decode_matches_reference(block_size, head_dim, heads, dtype, tolerance):
    num_heads, num_kv_heads = heads
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        DECODE_SEQ_LENS, block_size, num_kv_heads, head_dim, dtype
    )
    query = torch.randn(len(DECODE_SEQ_LENS), num_heads, head_dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    scale = head_dim**-0.5
    expected = pa.paged_attention_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)
    got = pa.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, num_splits=1)
    torch.testing.assert_close(got, expected, **tolerance(dtype))


@pytest.mark.parametrize("block_size, head_dim, heads, dtype", grid_cases())
def test_varlen_prefill_and_extend_match_reference(block_size, head_dim, heads, dtype, tolerance):
    num_heads, num_kv_heads = heads
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [s for s, _ in VARLEN_BATCH], block_size, num_kv_heads, head_dim, dtype
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, dtype)
    scale = head_dim**-0.5
    args = (query, key_cache, value_cache, block_tables, seq_lens, scale)
    expected = pa.paged_attention_reference(*args, query_start_loc=query_start_loc, max_query_len=max_q)
    got = pa.paged_attention(*args, query_start_loc=query_start_loc, max_query_len=max_q)
    torch.testing.assert_close(got, expected, **tolerance(dtype))


@pytest.mark.parametrize("seq_lens, num_splits", SPLIT_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_kv_decode_matches_reference(seq_lens, num_splits, dtype, tolerance):
    block_size, num_heads, num_kv_heads, head_dim = 16, 4, 2, 64
    plan = pa.plan_paged_attention(
        num_seqs=len(seq_lens),
        num_q_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_query_len=1,
        max_seq_len=max(seq_lens),
        is_decode=True,
        num_splits=num_splits,
    )
    assert plan.num_partitions > 1, "the case must exercise the split-KV path and its reduce"
    key_cache, value_cache, block_tables, seq_lens_t = make_paged_batch(
        seq_lens, block_size, num_kv_heads, head_dim, dtype
    )
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    args = (query, key_cache, value_cache, block_tables, seq_lens_t, 0.125)
    torch.testing.assert_close(
        pa.paged_attention(*args, num_splits=num_splits), pa.paged_attention_reference(*args), **tolerance(dtype)
    )


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_windowed_prefill_and_extend_match_reference(window, heads, dtype, tolerance):
    num_heads, num_kv_heads, head_dim = heads[0], heads[1], 32
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [s for s, _ in VARLEN_BATCH], 8, num_kv_heads, head_dim, dtype
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, dtype)
    args = (query, key_cache, value_cache, block_tables, seq_lens, head_dim**-0.5)
    kwargs = dict(query_start_loc=query_start_loc, max_query_len=max_q, window=window)
    expected = pa.paged_attention_reference(*args, **kwargs)
    torch.testing.assert_close(pa.paged_attention(*args, **kwargs), expected, **tolerance(dtype))


@pytest.mark.parametrize("window", [1, 9, 40, 150])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_windowed_decode_matches_reference_split_or_not(window, num_splits, tolerance):
    # Split: the partitions wholly before a query's window hold no key and must weigh nothing in the reduce.
    block_size, num_heads, num_kv_heads, head_dim = 16, 4, 2, 64
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [5, 70, 130], block_size, num_kv_heads, head_dim, torch.float32
    )
    query = torch.randn(3, num_heads, head_dim, generator=torch.Generator().manual_seed(4))
    args = (query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    expected = pa.paged_attention_reference(*args, window=window)
    got = pa.paged_attention(*args, num_splits=num_splits, window=window)
    torch.testing.assert_close(got, expected, **tolerance(torch.float32))


def test_rejects_a_window_of_no_keys():
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([4], 8, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="at least one key"):
        pa.paged_attention(torch.randn(1, 2, 16), key_cache, value_cache, block_tables, seq_lens, 0.25, window=0)


def test_block_ids_beyond_16_bits_are_addressed(tolerance):
    block_size, num_heads, num_kv_heads, head_dim = 8, 2, 1, 16
    num_blocks = (1 << 16) + 64  # 2**16 + 64 blocks of 8 x 16 fp16: a large table over a tiny cache
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [20, 9], block_size, num_kv_heads, head_dim, torch.float16, num_blocks=num_blocks
    )
    block_tables[0, :3] = torch.tensor([num_blocks - 1, 1 << 16, 70000 % num_blocks], dtype=torch.int32)
    key_cache[block_tables[0, :3].long()] = torch.randn(3, block_size, num_kv_heads, head_dim).half()
    value_cache[block_tables[0, :3].long()] = torch.randn(3, block_size, num_kv_heads, head_dim).half()
    query = torch.randn(2, num_heads, head_dim).half()
    args = (query, key_cache, value_cache, block_tables, seq_lens, 0.25)
    expected = pa.paged_attention_reference(*args)
    torch.testing.assert_close(pa.paged_attention(*args, num_splits=1), expected, **tolerance(torch.float16))
    torch.testing.assert_close(pa.paged_attention(*args, num_splits=2), expected, **tolerance(torch.float16))


def test_query_view_with_token_stride_is_read_correctly(tolerance):
    # The model passes q as a view into the fused qkv projection: token stride > Hq * D.
    block_size, num_heads, num_kv_heads, head_dim = 8, 4, 2, 64
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch(
        [12, 5], block_size, num_kv_heads, head_dim, torch.float32
    )
    qkv = torch.randn(2, (num_heads + 2 * num_kv_heads) * head_dim)
    query = qkv[:, : num_heads * head_dim].view(2, num_heads, head_dim)
    args = (query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    torch.testing.assert_close(
        pa.paged_attention(*args), pa.paged_attention_reference(*args), **tolerance(torch.float32)
    )


def test_rejects_query_heads_not_a_multiple_of_kv_heads():
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([4], 8, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        pa.paged_attention(torch.randn(1, 3, 16), key_cache, value_cache, block_tables, seq_lens, 0.25)


def test_rejects_int64_block_tables():
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([4], 8, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="int32"):
        pa.paged_attention(torch.randn(1, 2, 16), key_cache, value_cache, block_tables.long(), seq_lens, 0.25)


def test_plan_splits_long_context_decode_to_fill_the_device():
    # One sequence of 32k tokens with 8 kv heads on a 132-SM device: 8 programs without a split.
    plan = pa.plan_paged_attention(
        num_seqs=1,
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_query_len=1,
        max_seq_len=32768,
        is_decode=True,
        num_sms=132,
    )
    num_programs = 8 * plan.num_partitions
    assert 132 <= num_programs <= 2 * 132 + 8 and plan.partition_size % plan.block_n == 0
    assert plan.num_partitions * plan.partition_size >= 32768


def test_plan_does_not_split_a_large_decode_batch_or_prefill():
    big_batch = pa.plan_paged_attention(
        num_seqs=256,
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_query_len=1,
        max_seq_len=4096,
        is_decode=True,
        num_sms=132,
    )
    prefill = pa.plan_paged_attention(
        num_seqs=1,
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_query_len=4096,
        max_seq_len=4096,
        is_decode=False,
        num_sms=132,
    )
    assert not big_batch.is_split and not prefill.is_split
    assert prefill.num_q_tiles * prefill.block_q >= 4096


def test_rejects_a_plan_that_does_not_cover_the_context():
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([40], 8, 2, 16, torch.float32)
    plan = pa.plan_paged_attention(
        num_seqs=1,
        num_q_heads=2,
        num_kv_heads=2,
        head_dim=16,
        max_query_len=1,
        max_seq_len=20,
        is_decode=True,
        num_splits=1,
    )
    with pytest.raises(ValueError, match="inconsistent attention plan"):
        pa.paged_attention(torch.randn(1, 2, 16), key_cache, value_cache, block_tables, seq_lens, 0.25, plan=plan)


def test_empty_batch_gives_empty_output():
    key_cache, value_cache, block_tables, seq_lens = make_paged_batch([4], 8, 2, 16, torch.float32)
    starts = torch.zeros(2, dtype=torch.int32)
    out = pa.paged_attention(
        torch.randn(0, 2, 16),
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        0.25,
        query_start_loc=starts,
        max_query_len=0,
    )
    assert out.shape == (0, 2, 16)
