"""Paged attention over a block-table KV cache: decode, and prefill/extend over a cached prefix.

Math: for query token i of sequence b at absolute position p_i (its new tokens are the last q_len_b
of the seq_len_b context), query head h reads kv head h // (Hq / Hkv) (GQA; MQA when Hkv == 1):
    out[i, h] = softmax_j(scale * q[i, h] . k[j, h_kv]) v[j, h_kv]   over j <= p_i  (causal)
and, for a sliding-window layer of window W, only over p_i - W < j <= p_i (W keys, the query's own included, as
transformers' sliding-window masks have it).
with K/V row j of sequence b at key_cache[block_tables[b, j // block_size], j % block_size].
Softmax is accumulated online in float32 (flash attention).

Layouts:
    query            [num_tokens, Hq, D]       decode: num_tokens == num_seqs, one token each
    key/value_cache  [num_blocks, block_size, Hkv, D] contiguous
    block_tables     [num_seqs, max_blocks] int32 (rows padded with any valid block id, e.g. 0)
    seq_lens         [num_seqs] int32, context length including the new tokens
    query_start_loc  [num_seqs + 1] int32 or None (None means decode)
    out              like query
Memory traffic: each sequence's K and V are read once per kv head and query tile (2 * seq_len *
Hkv * D elements for decode), plus q and out; decode is bound by reading the cache. The split-KV
path adds num_partitions * Hq * (D + 2) float32 partials per sequence, written once and read once.
A sliding-window layer reads at most window + BLOCK_Q - 1 keys per query tile (the Triton kernel starts each
tile at its first query's window); the torch reference still gathers whole contexts and masks them.

Kernel design (written for this project from the published flash-attention / flash-decoding
algorithms and the PagedAttention block-table layout):
- One program per (sequence, kv head, query tile[, KV partition]). Its rows are the query tile's
  tokens times the kv head's query heads (GQA group), so each K/V tile is loaded once for the whole
  group and scores are one `tl.dot` of [BLOCK_Q * BLOCK_G, D] x [D, BLOCK_N].
- A K/V tile spans BLOCK_N consecutive positions of a sequence, which may cover several cache
  blocks: block ids are gathered from the block table per position, then widened to int64 so
  offsets past 2**31 elements stay correct.
- Decode (one query token per sequence) with long contexts and few sequences splits the context
  into partitions run by separate programs (flash-decoding); each writes an unnormalised partial
  output with its running max and sum, and `_reduce_partitions_kernel` merges them.
- Head dims that are not powers of two (80, 96) are padded to the next power of two and masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import FLOAT_DTYPES, check_dtype, check_same_device, next_power_of_2, triton_kernel

LOG2_E = 1.4426950408889634
MAX_PARTITIONS = 128


@dataclass(frozen=True)
class ReferenceGroup:
    """Sequences the reference attends in one SDPA call, padded to the group's longest query and context."""

    tokens: torch.Tensor | None  # [num_group_tokens] int64: the group's rows of the flat query (None: all, in order)
    blocks: torch.Tensor  # [num_seqs * num_blocks] int64: cache block of each sequence's padded block positions
    mask: torch.Tensor  # [num_seqs, 1, max_q, num_keys] float32: 0 for keys a query row sees, else
    # -inf (what SDPA makes of a bool mask, made once instead of per call)
    seq_of_token: torch.Tensor | None  # [num_group_tokens] int64 (None for decode: token i is sequence i, row 0)
    row_of_token: torch.Tensor | None  # [num_group_tokens] int64
    num_seqs: int
    max_q: int
    num_keys: int  # gathered key positions per sequence: whole blocks up to the group's longest


@dataclass(frozen=True)
class ReferenceLayout:
    """What the reference derives from the block tables and lengths alone, the same in every layer of a step:
    build it once per step with `reference_layout` and pass it to every layer's call.

    A batch that mixes decodes (one new token) with prefill chunks is attended in two groups, decodes and the
    rest: padded together, every decode would carry the longest chunk's query rows (31 decodes beside one
    128-token prompt: 32 x 128 rows instead of 159).
    """

    groups: tuple[ReferenceGroup, ...]
    window: int | None = None  # the sliding window its masks apply (None: causal only)


def reference_layout(
    block_tables, seq_lens, block_size, query_start_loc=None, max_seq_len=None, window=None
) -> ReferenceLayout:
    """The gather rows, causal (and, given a window, sliding-window) masks and query scatter of
    `paged_attention_reference` for one batch."""
    if query_start_loc is None:
        group = _reference_group(block_tables, seq_lens, block_size, None, max_seq_len, None, window)
        return ReferenceLayout((group,), window)
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    decode = q_lens == 1
    if bool(decode.all()) or not bool(decode.any()):
        group = _reference_group(block_tables, seq_lens, block_size, query_start_loc, max_seq_len, None, window)
        return ReferenceLayout((group,), window)
    # Flat token rows of each group, and each group's own query_start_loc.
    token_is_decode = torch.repeat_interleave(decode, q_lens.long())
    groups = []
    for seq_mask, token_mask in ((decode, token_is_decode), (~decode, ~token_is_decode)):
        seqs = seq_mask.nonzero().squeeze(1)
        loc = torch.nn.functional.pad(torch.cumsum(q_lens[seqs], 0), (1, 0))
        tokens = token_mask.nonzero().squeeze(1)
        groups.append(_reference_group(block_tables[seqs], seq_lens[seqs], block_size, loc, None, tokens, window))
    return ReferenceLayout(tuple(groups), window)


def _reference_group(
    block_tables, seq_lens, block_size, query_start_loc, max_seq_len, tokens, window
) -> ReferenceGroup:
    num_seqs = seq_lens.shape[0]
    device = seq_lens.device
    seq_lens = seq_lens.long()
    max_k = int(seq_lens.max()) if max_seq_len is None else int(max_seq_len)
    num_blocks = (max_k + block_size - 1) // block_size
    num_keys = num_blocks * block_size
    blocks = block_tables[:, :num_blocks].reshape(-1).long()
    if query_start_loc is None:
        q_lens = torch.ones(num_seqs, dtype=torch.int64, device=device)
        max_q, seq_of_token, row_of_token = 1, None, None
    else:
        q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
        max_q = int(q_lens.max())
        num_tokens = int(query_start_loc[-1])
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)
        row_of_token = torch.arange(num_tokens, device=device) - query_start_loc[:-1].long()[seq_of_token]
        if max_q == 1 and num_tokens == num_seqs:  # one token per sequence, in order: no scatter needed
            seq_of_token = row_of_token = None
    # Query row r of sequence b sits at position seq_len - q_len + r and sees keys up to it (and, with a window,
    # the window - 1 before it); padding rows see key 0 too (keeps softmax finite; their output is dropped).
    rows = torch.arange(max_q, device=device)
    q_pos = seq_lens[:, None] - q_lens[:, None] + rows[None, :]  # [num_seqs, max_q]
    k_pos = torch.arange(num_keys, device=device)
    mask = k_pos[None, None, :] <= q_pos[:, :, None]
    if window is not None:
        mask &= k_pos[None, None, :] > q_pos[:, :, None] - window
    is_padding = rows[None, :] >= q_lens[:, None]  # [num_seqs, max_q]
    mask |= (k_pos == 0)[None, None, :] & is_padding[:, :, None]
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=device).masked_fill_(~mask, float("-inf"))
    return ReferenceGroup(tokens, blocks, bias[:, None], seq_of_token, row_of_token, num_seqs, max_q, num_keys)


def paged_attention_reference(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    query_start_loc=None,
    max_query_len=1,
    max_seq_len=None,
    layout: ReferenceLayout | None = None,
    softcap: float | None = None,
    window: int | None = None,
):
    """The spec. Vectorised over sequences: gathers each sequence's blocks (whole blocks, one copy of
    block_size * Hkv * D elements each), pads to the longest of its group (decodes, or prefill chunks).

    layout: `reference_layout(...)` of these block tables and lengths, when the caller shares one across layers.
    softcap: scores become tanh(scores / softcap) * softcap before the mask and softmax (Gemma 2); only this
    reference implements it.
    window: a sliding-window layer's window (keys p - window < j <= p); None attends to the whole context.
    """
    if query.shape[0] == 0:
        return torch.empty_like(query)
    if layout is None:
        layout = reference_layout(block_tables, seq_lens, key_cache.shape[1], query_start_loc, max_seq_len, window)
    assert layout.window == window, "a layout masks for one window"
    if len(layout.groups) == 1:
        return _attend_group(query, key_cache, value_cache, scale, layout.groups[0], softcap)
    out = torch.empty_like(query)
    for group in layout.groups:
        out[group.tokens] = _attend_group(query[group.tokens], key_cache, value_cache, scale, group, softcap)
    return out


def softcapped_attention(q, k, v, bias, scale: float, softcap: float) -> torch.Tensor:
    """SDPA's math with soft-capped scores: q [B, Hq, Q, D], k and v [B, Hkv, K, D] (float32), bias broadcastable
    to [B, Hq, Q, K] (0 or -inf) -> [B, Hq, Q, D]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # each kv head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, Hq, Q, K]
    scores = torch.tanh(scores / softcap) * softcap + bias
    return torch.matmul(scores.softmax(dim=-1), v)


def _attend_group(query, key_cache, value_cache, scale, group: ReferenceGroup, softcap: float | None = None):
    """query [group tokens, Hq, D] -> out like it: one SDPA call over the group's gathered blocks."""
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    num_seqs, max_q, num_keys = group.num_seqs, group.max_q, group.num_keys
    # k, v: [num_seqs * num_blocks, block_size, Hkv, D] -> [num_seqs, num_keys, Hkv, D]
    k = key_cache.index_select(0, group.blocks).view(num_seqs, num_keys, num_kv_heads, head_dim)
    v = value_cache.index_select(0, group.blocks).view(num_seqs, num_keys, num_kv_heads, head_dim)
    # The flat queries as [num_seqs, max_q, Hq, D].
    if group.seq_of_token is None:
        q = query.view(num_seqs, 1, num_q_heads, head_dim)
    else:
        q = query.new_zeros(num_seqs, max_q, num_q_heads, head_dim)
        q[group.seq_of_token, group.row_of_token] = query
    q, k, v = q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2)
    if softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=group.mask, scale=scale, enable_gqa=num_q_heads != num_kv_heads
        )  # [num_seqs, Hq, max_q, D]
    else:
        out = softcapped_attention(q, k, v, group.mask, scale, softcap)
    if group.seq_of_token is None:
        return out[:, :, 0].to(query.dtype)
    return out.transpose(1, 2)[group.seq_of_token, group.row_of_token].to(query.dtype)


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale_log2,
    stride_q_token,
    stride_q_head,
    stride_out_token,
    stride_out_head,
    stride_cache_block,
    stride_cache_slot,
    stride_cache_head,
    stride_block_table,
    num_q_heads,
    num_partitions,
    partition_size,
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_DECODE: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    IS_WINDOWED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2) // num_partitions
    part = tl.program_id(2) % num_partitions
    seq_len = tl.load(seq_lens_ptr + seq)
    if IS_DECODE:
        q_start = seq
        q_len = 1
    else:
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start

    # Rows: query index in the tile (major) x query head in the group (minor).
    rows = tl.arange(0, BLOCK_Q * BLOCK_G)
    q_idx = q_tile * BLOCK_Q + rows // BLOCK_G
    g_idx = rows % BLOCK_G
    row_valid = (q_idx < q_len) & (g_idx < GROUP)
    head = kv_head * GROUP + g_idx
    q_pos = seq_len - q_len + q_idx
    token = (q_start + q_idx).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    q = tl.load(
        q_ptr + token[:, None] * stride_q_token + head[:, None] * stride_q_head + d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    )

    # Causal bound of the tile (its last query's position + 1), clipped to this partition.
    tile_q_end = tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)
    k_end = tl.where(q_tile * BLOCK_Q < q_len, seq_len - q_len + tile_q_end, 0)
    lo = part * partition_size
    hi = tl.minimum(k_end, lo + partition_size)
    if IS_WINDOWED:  # no key before the window of the tile's first query is read
        lo = tl.maximum(lo, seq_len - q_len + q_tile * BLOCK_Q - window + 1)

    # The running max starts at a finite -1e30, not -inf, so exp2(m_old - m_new) is 1, not NaN, for
    # rows (padding, empty partitions) that see no key.
    m_i = tl.full([BLOCK_Q * BLOCK_G], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)
        k_valid = k_pos < hi
        block_ids = tl.load(
            block_tables_ptr + seq * stride_block_table + k_pos // BLOCK_SIZE, mask=k_valid, other=0
        ).to(tl.int64)
        offs = block_ids * stride_cache_block + (k_pos % BLOCK_SIZE) * stride_cache_slot + kv_head * stride_cache_head
        kv_mask = k_valid[:, None] & d_valid[None, :]
        k = tl.load(k_cache_ptr + offs[:, None] + d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [M, BLOCK_N], log2 units
        seen = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        if IS_WINDOWED:
            seen = seen & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offs[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if IS_SPLIT:
        # Partials: part_out [T, Hq, P, D] (unnormalised), part_max / part_sum [T, Hq, P].
        part_row = (token * num_q_heads + head) * num_partitions + part
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM + d[None, :], acc, mask=row_valid[:, None] & d_valid[None, :]
        )
        tl.store(part_max_ptr + part_row, m_i, mask=row_valid)
        tl.store(part_sum_ptr + part_row, l_i, mask=row_valid)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_out_token + head[:, None] * stride_out_head + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & d_valid[None, :],
        )


@triton_kernel
def _reduce_partitions_kernel(
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_out_token,
    stride_out_head,
    num_q_heads,
    num_partitions,
    partition_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # Decode only: token == sequence. Merges the partitions that hold any of its context.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + token)
    num_used = (seq_len + partition_size - 1) // partition_size
    base = (token * num_q_heads + head) * num_partitions
    p = tl.arange(0, BLOCK_P)
    p_valid = p < num_used
    m = tl.load(part_max_ptr + base + p, mask=p_valid, other=-1.0e30)
    m_max = tl.max(m, 0)
    sums = tl.load(part_sum_ptr + base + p, mask=p_valid, other=0.0)
    total = tl.sum(sums * tl.exp2(m - m_max), 0)
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], tl.float32)
    for i in range(0, num_used):
        weight = tl.exp2(tl.load(part_max_ptr + base + i) - m_max)
        acc += weight * tl.load(part_out_ptr + (base + i) * HEAD_DIM + d, mask=d_valid, other=0.0)
    out = acc / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token * stride_out_token + head * stride_out_head + d, out.to(out_ptr.dtype.element_ty), mask=d_valid
    )


@dataclass(frozen=True)
class AttentionPlan:
    """Tile sizes and grid of one paged attention launch (a pure function of the batch shape)."""

    block_q: int  # query tokens per program
    block_g: int  # query heads per program (the GQA group, padded to a power of two)
    block_n: int  # key positions per inner-loop tile
    block_d: int  # head_dim padded to a power of two
    num_q_tiles: int
    num_partitions: int  # KV partitions per sequence; > 1 is the split-KV path
    partition_size: int  # key positions per partition, a multiple of block_n
    num_warps: int = 4
    num_stages: int = 2

    @property
    def is_split(self) -> bool:
        return self.num_partitions > 1


def plan_paged_attention(
    *, num_seqs, num_q_heads, num_kv_heads, head_dim, max_query_len, max_seq_len, is_decode, num_splits=None, num_sms=16
) -> AttentionPlan:
    """Chooses tiles and the KV split. num_splits None: decode splits until about two programs run
    per streaming multiprocessor (num_sms), keeping each partition at least four tiles long."""
    group = num_q_heads // num_kv_heads
    block_d = max(16, next_power_of_2(head_dim))
    block_n = 32 if block_d > 64 else 64
    if is_decode:
        # tl.dot needs at least 16 rows: pad the group (masked rows cost compute, not memory).
        block_q, block_g = 1, max(16, next_power_of_2(group))
        if num_splits is None:
            wanted = -(-2 * num_sms // max(1, num_seqs * num_kv_heads))
            num_splits = max(1, min(wanted, max_seq_len // (4 * block_n)))
    else:
        block_g = next_power_of_2(group)
        block_q = max(1, 64 // block_g)
        num_splits = 1  # prefill has parallelism across query tiles
    num_splits = max(1, min(int(num_splits), MAX_PARTITIONS, -(-max_seq_len // 16)))
    block_n = min(block_n, max(16, next_power_of_2(-(-max_seq_len // num_splits))))
    partition_size = -(-max_seq_len // num_splits)
    partition_size = -(-partition_size // block_n) * block_n
    return AttentionPlan(
        block_q=block_q,
        block_g=block_g,
        block_n=block_n,
        block_d=block_d,
        num_q_tiles=-(-max_query_len // block_q),
        num_partitions=-(-max_seq_len // partition_size),
        partition_size=partition_size,
    )


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 16


@dataclass(frozen=True)
class _InputShape:
    """What the launcher reads off checked inputs."""

    num_tokens: int
    num_q_heads: int
    head_dim: int
    block_size: int
    num_kv_heads: int
    num_seqs: int
    is_decode: bool


def _check_inputs(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, window) -> _InputShape:
    """Shapes, dtypes, strides and devices of `paged_attention`'s inputs (see its docstring), or a clear error."""
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            f"expected query [T, Hq, D] and caches [num_blocks, block_size, Hkv, D], got "
            f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}"
        )
    num_tokens, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    if cache_head_dim != head_dim or num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"head_dim {head_dim} vs cache {cache_head_dim}, or Hq {num_q_heads} not a multiple of Hkv {num_kv_heads}"
        )
    check_dtype("query", query, FLOAT_DTYPES)
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise TypeError(f"cache dtypes {key_cache.dtype}/{value_cache.dtype} differ from query dtype {query.dtype}")
    if query.stride(-1) != 1 or not key_cache.is_contiguous() or not value_cache.is_contiguous():
        raise ValueError("query must be contiguous in head_dim and the caches contiguous")
    num_seqs = seq_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be [{num_seqs}, max_blocks] int32, got {tuple(block_tables.shape)} {block_tables.dtype}"
        )
    if seq_lens.dtype != torch.int32:
        raise TypeError(f"seq_lens must be int32, got {seq_lens.dtype}")
    if window is not None and window < 1:
        raise ValueError(f"a sliding window holds at least one key, got {window}")
    is_decode = query_start_loc is None
    if is_decode:
        if num_tokens != num_seqs:
            raise ValueError(f"decode needs one query token per sequence: {num_tokens} tokens, {num_seqs} sequences")
    elif query_start_loc.shape != (num_seqs + 1,) or query_start_loc.dtype != torch.int32:
        raise ValueError(
            f"query_start_loc must be [{num_seqs + 1}] int32, got {tuple(query_start_loc.shape)} {query_start_loc.dtype}"
        )
    check_same_device(
        query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables, seq_lens=seq_lens
    )
    return _InputShape(num_tokens, num_q_heads, head_dim, block_size, num_kv_heads, num_seqs, is_decode)


def _check_plan(plan: AttentionPlan, shape: _InputShape, max_query_len: int, max_seq_len: int) -> None:
    """A plan (given for tuning, or planned) covers the batch: partitions span max_seq_len, tiles max_query_len."""
    if (
        plan.partition_size % plan.block_n
        or plan.num_partitions * plan.partition_size < max_seq_len
        or plan.num_q_tiles * plan.block_q < max_query_len
        or plan.block_d < shape.head_dim
        or plan.block_g < shape.num_q_heads // shape.num_kv_heads
        or (plan.is_split and not shape.is_decode)
    ):
        raise ValueError(f"inconsistent attention plan {plan} for max_seq_len {max_seq_len}")


def paged_attention(
    query,
    key_cache,
    value_cache,
    block_tables,
    seq_lens,
    scale,
    query_start_loc=None,
    max_query_len=1,
    max_seq_len=None,
    num_splits=None,
    plan=None,
    window=None,
):
    """Attention of new query tokens over their sequences' paged KV cache (Triton).

    Args:
        query: [num_tokens, num_heads, head_dim] fp16/bf16/fp32; last dim contiguous. For decode
            (query_start_loc None) num_tokens == num_seqs, token i belongs to sequence i.
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, same
            dtype as query; num_heads % num_kv_heads == 0 (GQA; MQA when num_kv_heads == 1).
        block_tables: [num_seqs, max_blocks] int32; row b lists sequence b's cache blocks in order.
        seq_lens: [num_seqs] int32, each sequence's context length including its new tokens.
        scale: softmax scale, usually head_dim ** -0.5.
        query_start_loc: [num_seqs + 1] int32 offsets of each sequence's new tokens in `query`
            (prefill/extend); the new tokens are the last q_len of the context, attention is causal.
        max_query_len: the largest q_len in the batch (sizes the grid; must not be understated).
        max_seq_len: the largest seq_len (sizes the split; read from seq_lens when None).
        num_splits: KV partitions per decode sequence (flash-decoding); None picks by occupancy,
            1 disables. Prefill/extend never splits.
        plan: an AttentionPlan to launch instead of `plan_paged_attention`'s (tuning; gpu_check).
        window: a sliding-window layer's window: query position p sees keys p - window < j <= p; None: all j <= p.
    Returns:
        [num_tokens, num_heads, head_dim] in query's dtype.
    """
    shape = _check_inputs(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, window)
    num_tokens, num_q_heads, head_dim = shape.num_tokens, shape.num_q_heads, shape.head_dim
    num_kv_heads, num_seqs, is_decode = shape.num_kv_heads, shape.num_seqs, shape.is_decode
    block_size = shape.block_size
    if is_decode:
        max_query_len = 1
        query_start_loc = seq_lens  # unused by the decode kernel
    block_tables = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())

    plan = plan or plan_paged_attention(
        num_seqs=num_seqs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        is_decode=is_decode,
        num_splits=num_splits,
        num_sms=_num_sms(query.device),
    )
    num_partitions, is_split = plan.num_partitions, plan.is_split
    _check_plan(plan, shape, max_query_len, max_seq_len)
    if is_split:
        part_out = torch.empty(
            (num_tokens, num_q_heads, num_partitions, head_dim), dtype=torch.float32, device=query.device
        )
        part_max = torch.empty((num_tokens, num_q_heads, num_partitions), dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_out = part_max = part_sum = out
    grid = (num_seqs, num_kv_heads, plan.num_q_tiles * num_partitions)
    _paged_attention_kernel.on(query.device)[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        part_out,
        part_max,
        part_sum,
        float(scale) * LOG2_E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        num_q_heads,
        num_partitions,
        plan.partition_size,
        window or 0,
        GROUP=num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_G=plan.block_g,
        BLOCK_Q=plan.block_q,
        BLOCK_N=plan.block_n,
        BLOCK_D=plan.block_d,
        IS_DECODE=is_decode,
        IS_SPLIT=is_split,
        IS_WINDOWED=window is not None,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )
    if is_split:
        _reduce_partitions_kernel.on(query.device)[(num_tokens, num_q_heads)](
            part_out,
            part_max,
            part_sum,
            seq_lens,
            out,
            out.stride(0),
            out.stride(1),
            num_q_heads,
            num_partitions,
            plan.partition_size,
            HEAD_DIM=head_dim,
            BLOCK_D=plan.block_d,
            BLOCK_P=next_power_of_2(num_partitions),
        )
    return out
