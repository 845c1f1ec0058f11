"""StaticStep (the exported function), run eagerly: the same logits as the paged model, whatever the padding."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.compiled.step import StaticStep
from inferfleet_runtime.layers.attention_backend import PagedAttention, allocate_kv_cache, build_attention_metadata

CONTEXT, SLOTS = 48, 3


@torch.inference_mode()
def _paged_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] of every position, from one paged prefill."""
    n = len(tokens)
    kv = allocate_kv_cache(model.config, -(-n // 16) + 1, 16, torch.device("cpu"))
    meta, positions = build_attention_metadata([list(range(1, -(-n // 16) + 1))], [n], [n], 16)
    return model.compute_logits(model(torch.tensor(tokens), positions, PagedAttention(kv, meta, model.ops)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
def test_chunked_prefill_then_padded_decode_match_the_paged_model(demo_model_dir, dtype, tol):
    loaded = load_model(demo_model_dir, dtype=dtype, kernels="reference", device="cpu")
    model = loaded.model
    step = StaticStep(model, CONTEXT).eval()
    c = loaded.config
    kv = torch.zeros(c.num_layers, 2, SLOTS, CONTEXT, c.num_kv_heads, c.head_dim, dtype=dtype)
    prompts = [loaded.tokenizer.encode(p) for p in ("Beautiful is better than ugly. Explicit is", "Flat is")]
    slots = [2, 0]  # not in order, and slot 1 stays empty
    assert len(prompts[0]) > 8 >= len(prompts[1])
    with torch.no_grad():
        # Prefill in pieces of a 8-token bucket (padded), the second piece over the first one's cached K/V.
        for prompt, slot in zip(prompts, slots):
            for start in range(0, len(prompt), 8):
                piece = prompt[start : start + 8]
                ids = torch.tensor([piece + [0] * (8 - len(piece))])
                logits, new_kv = step(ids, torch.tensor([start]), torch.tensor([len(piece)]), torch.tensor([slot]), kv)
                kv[:, :, slot, start : start + len(piece)] = new_kv[:, :, 0, : len(piece)]
            want = _paged_logits(model, prompt)[-1]
            torch.testing.assert_close(logits[0], want, rtol=tol, atol=tol)
        # One decode step of both sequences in a 3-row bucket; the last row is padding.
        nexts = [17, 42]
        ids = torch.tensor([[nexts[0]], [nexts[1]], [0]])
        starts = torch.tensor([len(prompts[0]), len(prompts[1]), 0])
        logits, _ = step(ids, starts, torch.ones(3, dtype=torch.int64), torch.tensor(slots + [1]), kv)
    for row, (prompt, nxt) in enumerate(zip(prompts, nexts)):
        want = _paged_logits(model, prompt + [nxt])[-1]
        torch.testing.assert_close(logits[row], want, rtol=tol, atol=tol)
    assert torch.isfinite(logits[2]).all()
