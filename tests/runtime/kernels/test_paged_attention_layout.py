"""A reference layout built once per step and shared by every layer gives the reference's own output."""

from __future__ import annotations

import torch

from inferfleet_runtime.kernels import paged_attention as pa

from ..support.paged_batches import (
    VARLEN_BATCH,
    dense_causal_attention,
    gather_sequence,
    make_paged_batch,
    varlen_query,
)


def test_shared_layout_matches_reference_and_dense_attention_for_prefill_and_extend():
    block_size, num_heads, num_kv_heads, head_dim = 8, 4, 2, 16
    seq_lens = [s for s, _ in VARLEN_BATCH]
    key_cache, value_cache, block_tables, lens = make_paged_batch(
        seq_lens, block_size, num_kv_heads, head_dim, torch.float32
    )
    query, query_start_loc, max_q = varlen_query(VARLEN_BATCH, num_heads, head_dim, torch.float32)
    layout = pa.reference_layout(block_tables, lens, block_size, query_start_loc, max(seq_lens))
    # Decodes (one new token) and prefill chunks are two groups, each padded to its own longest query and context.
    decodes, chunks = layout.groups
    one_token = [b for b, (_, q_len) in enumerate(VARLEN_BATCH) if q_len == 1]
    assert decodes.tokens.tolist() == [int(query_start_loc[b]) for b in one_token] and decodes.max_q == 1
    assert decodes.num_keys == -(-max(seq_lens[b] for b in one_token) // block_size) * block_size
    rest = [b for b in range(len(VARLEN_BATCH)) if b not in one_token]
    rows = [r for b in rest for r in range(int(query_start_loc[b]), int(query_start_loc[b + 1]))]
    assert chunks.tokens.tolist() == rows and chunks.max_q == max_q and chunks.num_seqs == len(rest)
    assert chunks.num_keys == -(-max(seq_lens[b] for b in rest) // block_size) * block_size
    kwargs = dict(query_start_loc=query_start_loc, max_query_len=max_q, max_seq_len=max(seq_lens))
    shared = pa.paged_attention_reference(
        query, key_cache, value_cache, block_tables, lens, 0.3, layout=layout, **kwargs
    )
    own = pa.paged_attention_reference(query, key_cache, value_cache, block_tables, lens, 0.3, **kwargs)
    assert torch.equal(shared, own)
    for b, (seq_len, _) in enumerate(VARLEN_BATCH):
        rows = slice(int(query_start_loc[b]), int(query_start_loc[b + 1]))
        k = gather_sequence(key_cache, block_tables[b], seq_len, block_size)
        v = gather_sequence(value_cache, block_tables[b], seq_len, block_size)
        torch.testing.assert_close(shared[rows], dense_causal_attention(query[rows], k, v, 0.3))


def test_decode_layout_skips_the_query_scatter_and_matches_dense_attention():
    block_size, num_heads, num_kv_heads, head_dim = 16, 4, 1, 8
    seq_lens = [1, 7, 16, 17, 33]
    key_cache, value_cache, block_tables, lens = make_paged_batch(
        seq_lens, block_size, num_kv_heads, head_dim, torch.float32
    )
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(3))
    layout = pa.reference_layout(block_tables, lens, block_size)
    (group,) = layout.groups
    assert group.tokens is None and group.seq_of_token is None and group.max_q == 1
    # The mask is SDPA's additive bias: 0 where a key is seen, -inf elsewhere (key 0 always seen).
    assert set(group.mask.unique().tolist()) == {0.0, float("-inf")} and bool((group.mask[..., 0] == 0).all())
    out = pa.paged_attention_reference(query, key_cache, value_cache, block_tables, lens, 0.5, layout=layout)
    for b, seq_len in enumerate(seq_lens):
        k = gather_sequence(key_cache, block_tables[b], seq_len, block_size)
        v = gather_sequence(value_cache, block_tables[b], seq_len, block_size)
        torch.testing.assert_close(out[b : b + 1], dense_causal_attention(query[b : b + 1], k, v, 0.5))
