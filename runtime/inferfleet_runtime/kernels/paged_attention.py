"""Paged attention over a block-table KV cache: decode, and prefill/extend over a cached prefix.

Math: for query token i of sequence b at absolute position p_i (its new tokens are the last q_len_b
of the seq_len_b context), query head h reads kv head h // (Hq / Hkv) (GQA; MQA when Hkv == 1):
    out[i, h] = softmax_j(scale * q[i, h] . k[j, h_kv]) v[j, h_kv]   over j <= p_i  (causal)
with K/V row j of sequence b at key_cache[block_tables[b, j // block_size], j % block_size].
Softmax is accumulated online in float32 (flash attention).

Layouts:
    query            [num_tokens, Hq, D]       decode: num_tokens == num_seqs, one token each
    key/value_cache  [num_blocks, block_size, Hkv, D] contiguous
    block_tables     [num_seqs, max_blocks] int32 (rows padded with any valid block id, e.g. 0)
    seq_lens         [num_seqs] int32, context length including the new tokens
    query_start_loc  [num_seqs + 1] int32 or None (None means decode)
    out              like query
Memory traffic: each sequence's K and V are read once per kv head group (2 * seq_len * Hkv * D
elements), plus q and out; decode is bound by reading the cache.
"""

from __future__ import annotations

import torch


def paged_attention_reference(
    query, key_cache, value_cache, block_tables, seq_lens, scale,
    query_start_loc=None, max_query_len=1, max_seq_len=None,
):
    """The spec. Vectorised over sequences: gathers each sequence's blocks, pads to the longest."""
    num_seqs = seq_lens.shape[0]
    num_tokens, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    device = query.device
    if num_tokens == 0:
        return torch.empty_like(query)
    if query_start_loc is None:
        query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
    seq_lens = seq_lens.long()
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    max_q = int(q_lens.max())
    max_k = int(seq_lens.max()) if max_seq_len is None else int(max_seq_len)
    num_blocks = (max_k + block_size - 1) // block_size
    # k, v: [num_seqs, num_blocks * block_size, Hkv, D]
    blocks = block_tables[:, :num_blocks].long()
    k = key_cache[blocks].reshape(num_seqs, num_blocks * block_size, num_kv_heads, head_dim)
    v = value_cache[blocks].reshape(num_seqs, num_blocks * block_size, num_kv_heads, head_dim)
    # Scatter the flat queries into [num_seqs, max_q, Hq, D].
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)
    row_of_token = torch.arange(num_tokens, device=device) - query_start_loc[:-1].long()[seq_of_token]
    q = query.new_zeros(num_seqs, max_q, num_q_heads, head_dim)
    q[seq_of_token, row_of_token] = query
    # Query row r of sequence b sits at position seq_len - q_len + r and sees keys up to it;
    # padding rows see key 0 only (keeps softmax finite; their output is dropped).
    q_pos = seq_lens[:, None] - q_lens[:, None] + torch.arange(max_q, device=device)[None, :]
    k_pos = torch.arange(num_blocks * block_size, device=device)
    mask = k_pos[None, None, :] <= q_pos[:, :, None]
    mask |= (k_pos == 0)[None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
        attn_mask=mask[:, None], scale=scale, enable_gqa=num_q_heads != num_kv_heads,
    )  # [num_seqs, Hq, max_q, D]
    return out.transpose(1, 2)[seq_of_token, row_of_token].to(query.dtype)
