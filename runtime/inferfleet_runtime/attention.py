"""Paged KV cache layout and the per-step attention metadata shared by the model, engine and kernels."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# KV cache of one layer: (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim].
KVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's new tokens go in the paged cache and which context each sequence attends to.

    New tokens of sequence i occupy flat positions query_start_loc[i]:query_start_loc[i+1]; they are the
    last q_len_i tokens of its context. A batch is decode-only when max_query_len == 1.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset of each new token
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, rows padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including this step's new tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: offsets of each sequence's new tokens
    max_query_len: int
    max_seq_len: int
    # Values derived from the fields above once per step and shared by every layer (e.g. the reference
    # attention's gather layout), filled in by their first user.
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def build_attention_metadata(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Metadata and positions [num_tokens] int64 for sequences whose last query_lens[i] tokens are new.

    block_tables[i] lists the blocks of sequence i in order; it must cover seq_lens[i] tokens.
    """
    assert len(block_tables) == len(seq_lens) == len(query_lens)
    slots: list[int] = []
    positions: list[int] = []
    starts = [0]
    for table, seq_len, query_len in zip(block_tables, seq_lens, query_lens):
        assert 0 < query_len <= seq_len <= len(table) * block_size
        for pos in range(seq_len - query_len, seq_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            positions.append(pos)
        starts.append(starts[-1] + query_len)
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return meta, torch.tensor(positions, dtype=torch.int64, device=device)
