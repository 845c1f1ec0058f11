"""Paged KV cache layout, the per-step attention metadata, and the paged attention the model is run with.

The model calls one method of an attention object it is given per step, `forward(layer_index, q, k, v, scale)`
(plus `softcap` for Gemma 2's soft-capped scores and `window` for a sliding-window layer);
`PagedAttention` here is the serving one (the compiled export brings its own, `compiled.step.StaticSlotAttention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.kernels.paged_attention import ReferenceLayout, paged_attention_reference, reference_layout
from inferfleet_runtime.model_config import ModelConfig

# KV cache of one layer: (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_dim].
KVCache = tuple[torch.Tensor, torch.Tensor]


class AttentionBackend(Protocol):
    """Where a step's keys and values come from and go to; the model's layers call it in order 0..L-1."""

    def forward(
        self,
        layer_index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        softcap: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D], k and v [T, Hkv, D] of this step's new tokens, rotated -> out [T, Hq, D] in q's dtype.
        softcap: scores become tanh(scores / softcap) * softcap before the softmax (Gemma 2).
        window: a sliding-window layer's; the query at position p sees keys p - window < j <= p (None: j <= p)."""
        ...


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

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class PagedAttention:
    """One step's attention over the paged cache: each layer writes its new K/V into its cache, then attends.

    Built once per step; what depends on the step and not the layer (the reference's gather rows and mask, one
    per window the layers use) is derived here once and shared by the layers.
    """

    def __init__(self, kv_caches: list[KVCache], meta: AttentionMetadata, ops: KernelOps):
        self.kv_caches, self.meta, self.ops = kv_caches, meta, ops
        self.kwargs: dict = {"max_seq_len": meta.max_seq_len}
        # The reference's layouts by window (on another backend, for soft-capped layers), built when first needed.
        self._layouts: dict[int | None, ReferenceLayout] = {}
        if not meta.is_decode_only:
            self.kwargs.update(query_start_loc=meta.query_start_loc, max_query_len=meta.max_query_len)

    def forward(
        self,
        layer_index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        softcap: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        key_cache, value_cache = self.kv_caches[layer_index]
        self.ops.write_kv(k, v, key_cache, value_cache, self.meta.slot_mapping)
        args = (q, key_cache, value_cache, self.meta.block_tables, self.meta.seq_lens, scale)
        # Only the torch reference soft-caps (the model logged the fallback at load).
        if softcap is not None or self.ops.backend == "reference":
            layout = self._reference_layout(window, key_cache.shape[1])
            return paged_attention_reference(*args, softcap=softcap, window=window, layout=layout, **self.kwargs)
        return self.ops.paged_attention(*args, window=window, **self.kwargs)  # [T, Hq, D]

    def _reference_layout(self, window: int | None, block_size: int) -> ReferenceLayout:
        """The reference's layout for window, built at most once per step whichever backend runs."""
        if window not in self._layouts:
            meta = self.meta
            self._layouts[window] = reference_layout(
                meta.block_tables, meta.seq_lens, block_size, self.kwargs.get("query_start_loc"), meta.max_seq_len,
                window,
            )  # fmt: skip
        return self._layouts[window]


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int, device: torch.device) -> list[KVCache]:
    """One zeroed (key_cache, value_cache) per layer, each [num_blocks, block_size, num_kv_heads, head_dim]."""
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [
        (torch.zeros(shape, dtype=config.dtype, device=device), torch.zeros(shape, dtype=config.dtype, device=device))
        for _ in range(config.num_layers)
    ]


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int) -> int:
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * config.dtype.itemsize


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
