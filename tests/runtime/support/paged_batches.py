"""Paged KV-cache batches for the attention kernel tests: scattered block tables, varlen queries, a dense reference."""

from __future__ import annotations

import torch

# Decode: context lengths 1, inside one block, on and across block boundaries.
DECODE_SEQ_LENS = [1, 7, 16, 17, 33]
# Prefill/extend: (seq_len, q_len) per sequence: fresh prompts, extends over a cached prefix, a
# one-token sequence, and chunks that start and end inside blocks.
VARLEN_BATCH = [(1, 1), (9, 9), (21, 5), (16, 16), (34, 1), (40, 23)]
# Sliding windows: one key, windows inside a block, on a block's length, across blocks, longer than most contexts.
WINDOWS = [1, 5, 8, 13, 40]


def make_paged_batch(seq_lens, block_size, num_kv_heads, head_dim, dtype, num_blocks=None, seed=0):
    """Random caches and block tables whose blocks are scattered over the cache (no block 0 used)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    max_blocks = max(blocks_per_seq) + 1  # one padding column
    num_blocks = num_blocks or sum(blocks_per_seq) + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if num_blocks * block_size * num_kv_heads * head_dim <= 1 << 22:
        key_cache = torch.randn(shape, generator=gen).to(dtype)
        value_cache = torch.randn(shape, generator=gen).to(dtype)
    else:  # a huge but sparse cache: only the used blocks get random values
        key_cache = torch.zeros(shape, dtype=dtype)
        value_cache = torch.zeros(shape, dtype=dtype)
    ids = (torch.randperm(num_blocks - 1, generator=gen)[: sum(blocks_per_seq)] + 1).tolist()
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for b, n in enumerate(blocks_per_seq):
        row, ids = ids[:n], ids[n:]
        block_tables[b, :n] = torch.tensor(row, dtype=torch.int32)
        if num_blocks * block_size * num_kv_heads * head_dim > 1 << 22:
            key_cache[row] = torch.randn(key_cache[row].shape, generator=gen).to(dtype)
            value_cache[row] = torch.randn(value_cache[row].shape, generator=gen).to(dtype)
    return key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32)


def dense_causal_attention(q, k, v, scale, window=None):
    """Independent spec for one sequence: q [Lq, Hq, D] are the last Lq of k, v [L, Hkv, D]; with a window, query
    position p sees keys p - window < j <= p (transformers' sliding-window mask)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    offset = k.shape[0] - q.shape[0]
    k_pos, q_pos = torch.arange(k.shape[0])[None, :], torch.arange(q.shape[0])[:, None] + offset
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def gather_sequence(cache, block_table, seq_len, block_size):
    pos = torch.arange(seq_len)
    return cache[block_table[pos // block_size].long(), pos % block_size]


def varlen_query(batch, num_heads, head_dim, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    q_lens = torch.tensor([q for _, q in batch])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
    query = torch.randn(int(q_lens.sum()), num_heads, head_dim, generator=gen).to(dtype)
    return query, query_start_loc, int(q_lens.max())
