"""A minimal greedy loop through the runtime model over the paged KV cache (test helper, not the engine)."""

from __future__ import annotations

import random

import torch

from inferfleet_runtime.layers.attention_backend import PagedAttention, allocate_kv_cache, build_attention_metadata

# The largest logit difference int8 activations (native.c's int8-activation matmul) may make against float
# activations (the reference backend), as a fraction of the logits' standard deviation. Measured on the tiny test
# models: 0.18 (int8 weights) and 0.13 (int4) of the native-quantized tests, 0.10-0.14 of the GGUF Q8_0 / Q4_0 /
# Q4_1 ones, with greedy agreement 0.94-0.99 (their random weights give close top logits: near ties that the
# rounding flips; each flipped margin was under 0.05).
INT8_ACTIVATION_LOGIT_BOUND = 0.3


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
    kv_caches = allocate_kv_cache(model.config, len(pool) + 1, block_size, model.norm.weight.device)
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


@torch.inference_mode()
def teacher_forced_logits(model, sequences: list[list[int]], block_size: int = 16) -> list[torch.Tensor]:
    """Each sequence's logits at every position ([len, vocab] float32), all sequences prefilled in one step."""
    tables, next_block = [], 1
    for seq in sequences:
        blocks = -(-len(seq) // block_size)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    kv_caches = allocate_kv_cache(model.config, next_block, block_size, model.norm.weight.device)
    lens = [len(s) for s in sequences]
    meta, positions = build_attention_metadata(tables, lens, lens, block_size)
    hidden = model(
        torch.tensor([t for s in sequences for t in s]), positions, PagedAttention(kv_caches, meta, model.ops)
    )
    return list(model.compute_logits(hidden).split(lens))


def greedy_agreement(expected: list[torch.Tensor], got: list[torch.Tensor]) -> tuple[float, float, float]:
    """Teacher-forced greedy agreement of two models' logits over the same tokens: (the fraction of positions whose
    argmax agrees, the largest logit difference, the largest top-2 margin of `expected` where they disagree; 0 if
    nowhere). A disagreement with a margin below twice the largest difference is a near tie, not an error."""
    expected, got = torch.cat(expected), torch.cat(got)
    agree = expected.argmax(-1) == got.argmax(-1)
    top2 = expected.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1])[~agree]
    worst_margin = margins.max().item() if margins.numel() else 0.0
    return agree.float().mean().item(), (expected - got).abs().max().item(), worst_margin


def check_int8_activation_agreement(reference, model, sequences: list[list[int]], label: str) -> None:
    """Teacher-forced over `sequences`, `model` (int8 activations) against `reference` (float activations): the
    logits within INT8_ACTIVATION_LOGIT_BOUND of their spread (and really rounded), every flipped token a near tie,
    and greedy agreement of at least 0.8. Prints the figures."""
    expected = teacher_forced_logits(reference, sequences)
    agreement, difference, margin = greedy_agreement(expected, teacher_forced_logits(model, sequences))
    spread = torch.cat(expected).std().item()
    print(f"{label} int8 activations: greedy agreement {agreement:.3f}, logits within {difference:.4f} "
          f"(std {spread:.3f}), largest margin flipped {margin:.4f}")  # fmt: skip
    assert 0 < difference <= INT8_ACTIVATION_LOGIT_BOUND * spread
    assert margin <= 2 * difference  # every disagreement a near tie
    assert agreement >= 0.8
