"""Greedy decoding through the paged runtime model matches Hugging Face transformers token for token."""

from __future__ import annotations

import pytest
import torch

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.linear import can_pack_linears, pack_linears

from ..support.paged_greedy import greedy_paged, hf_greedy, truncate_after_eos

CONFIGS = {
    "gqa": dict(num_attention_heads=4, num_key_value_heads=2),
    "tied-mha": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, rope_theta=500000.0),
    "llama3-rope-mqa": dict(
        num_attention_heads=4,
        num_key_value_heads=1,
        hidden_size=128,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "linear-rope-bias-wide-heads": dict(
        num_key_value_heads=2,
        head_dim=32,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
}
PROMPT_LENGTHS = [1, 3, 8, 13, 22]
NUM_NEW_TOKENS = 10


@pytest.mark.slow
@pytest.mark.parametrize("linears", ["nn-linear", "packed-linear", "native-linear"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_matches_transformers_for_batched_chunked_prompts(tiny_llama_factory, name, linears):
    # What ModelRunner serves with on a CPU: the native kernels with their matmul, or oneDNN's packed weights;
    # a variant this machine cannot build (no C compiler, no oneDNN ops in torch) skips before any model loads.
    if linears == "native-linear" and native.library() is None:
        pytest.skip(native.unavailable_reason())
    if linears == "packed-linear" and not can_pack_linears(torch.device("cpu"), torch.float32):
        pytest.skip("this torch has no oneDNN linear ops")
    model_dir = tiny_llama_factory(name, **CONFIGS[name])
    gen = torch.Generator().manual_seed(len(name))
    prompts = [torch.randint(3, 384, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = hf_greedy(hf_model, prompts, NUM_NEW_TOKENS)
    lm = load_model(model_dir, device="cpu", kernels="native" if linears == "native-linear" else "reference")
    if linears != "nn-linear":
        assert pack_linears(lm.model, min_weight=0) == 4 * lm.config.num_layers + 1  # these models are small
    got = greedy_paged(lm.model, prompts, NUM_NEW_TOKENS, block_size=4, chunk_size=5)
    assert truncate_after_eos(got, lm.config.eos_token_ids) == expected
    # The reference must not be degenerate, or the comparison would prove little.
    assert len({tuple(out) for out in expected}) == len(prompts)
    assert sum(len(out) for out in expected) >= 0.8 * NUM_NEW_TOKENS * len(prompts)
