"""Paged forward steps through a model, run once by the whole-stack native forward and once op by op."""

from __future__ import annotations

import torch

from inferfleet_runtime.layers.attention_backend import allocate_kv_cache


def fused_and_op_by_op(model, steps, block_size: int, threads: int):
    """(hidden states, caches) of the steps through the whole-stack native forward, then again op by op."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        fused_caches = allocate_kv_cache(model.config, 10, block_size, torch.device("cpu"))
        fused = paged_steps(model, fused_caches, steps, block_size)
        weights, model.native_weights = model.native_weights, None
        op_caches = allocate_kv_cache(model.config, 10, block_size, torch.device("cpu"))
        op_by_op = paged_steps(model, op_caches, steps, block_size)
        model.native_weights = weights
    finally:
        torch.set_num_threads(before)
    return fused, fused_caches, op_by_op, op_caches


def paged_steps(model, kv_caches, steps, block_size):
    """Runs steps [(block_tables, seq_lens, query_lens, input_ids)] through model; returns each step's hidden."""
    from inferfleet_runtime.layers.attention_backend import PagedAttention, build_attention_metadata

    hidden = []
    with torch.inference_mode():
        for tables, seq_lens, query_lens, ids in steps:
            meta, positions = build_attention_metadata(tables, seq_lens, query_lens, block_size)
            hidden.append(model(torch.tensor(ids), positions, PagedAttention(kv_caches, meta, model.ops)))
    return hidden
