"""A minimal greedy loop through the runtime model over the paged KV cache (test helper, not the engine)."""

from __future__ import annotations

import random

import torch

from inferfleet_runtime.attention import PagedAttention, allocate_kv_cache, build_attention_metadata


@torch.inference_mode()
def greedy_paged(
    model, prompts: list[list[int]], num_new_tokens: int, block_size: int = 4, chunk_size: int = 5, seed: int = 0
) -> list[list[int]]:
    """Runs all prompts as one batch: prefill in chunks of chunk_size, then decode, num_new_tokens each.

    Each step mixes the sequences still prefilling (a chunk each) with those decoding (one token each);
    blocks are handed out from a shuffled pool so block tables are not contiguous.
    """
    max_len = max(len(p) for p in prompts) + num_new_tokens
    blocks_per_seq = -(-max_len // block_size)
    pool = list(range(1, len(prompts) * blocks_per_seq + 1))  # block 0 stays unused: padding in block tables
    random.Random(seed).shuffle(pool)
    tables = [pool[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(len(prompts))]
    kv_caches = allocate_kv_cache(model.config, len(pool) + 1, block_size, model.embed_tokens.weight.device)
    tokens = [list(p) for p in prompts]
    num_computed = [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    while any(len(out) < num_new_tokens for out in outputs):
        active = [i for i, out in enumerate(outputs) if len(out) < num_new_tokens]
        query_lens = [min(chunk_size, len(tokens[i]) - num_computed[i]) for i in active]
        seq_lens = [num_computed[i] + q for i, q in zip(active, query_lens)]
        used_tables = [tables[i][: -(-n // block_size)] for i, n in zip(active, seq_lens)]
        meta, positions = build_attention_metadata(used_tables, seq_lens, query_lens, block_size)
        input_ids = torch.tensor(
            [t for i, q in zip(active, query_lens) for t in tokens[i][num_computed[i] : num_computed[i] + q]]
        )
        hidden = model(input_ids, positions, PagedAttention(kv_caches, meta, model.ops))
        last_rows = meta.query_start_loc[1:].long() - 1
        next_ids = model.compute_logits(hidden[last_rows]).argmax(dim=-1).tolist()
        for i, q, next_id in zip(active, query_lens, next_ids):
            num_computed[i] += q
            if num_computed[i] == len(tokens[i]):  # prompt done (or a decode step): the logits predict a token
                tokens[i].append(next_id)
                outputs[i].append(next_id)
    return outputs


def hf_greedy(hf_model, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy generate, one prompt at a time; it stops after an EOS token."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=num_new_tokens, pad_token_id=0
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def truncate_after_eos(outputs: list[list[int]], eos_token_ids: list[int]) -> list[list[int]]:
    """Each output up to and including its first EOS token (where transformers' generate stops)."""
    cut = []
    for out in outputs:
        end = next((i + 1 for i, t in enumerate(out) if t in eos_token_ids), len(out))
        cut.append(out[:end])
    return cut
