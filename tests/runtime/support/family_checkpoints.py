"""Tiny random-weight checkpoints of each model family, and what transformers makes of them (greedy tokens, logits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from inferfleet_runtime.demo import text as demo_text

from .paged_greedy import hf_greedy

TINY = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


class Case(NamedTuple):
    config_class: str  # transformers' classes that build and save the checkpoint
    model_class: str
    overrides: dict  # on TINY
    # native.c's whole-stack forward runs it; where not, the layers run op by op on the native kernels (logged)
    has_native_forward: bool = True
    # ops with no native kernel, run through the torch reference on the native backend (logged)
    has_reference_only_ops: bool = False


# Sliding windows as long as the context (256) attend as full attention. The "-window" cases have windows shorter
# than the longer prompts (up to 22 tokens, plus 10 generated) and not multiples of the tests' 4-token blocks, so
# windows start inside blocks, drop whole blocks and slide while decoding and across prefill chunks.
CASES = {
    "llama": Case("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": Case("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6)),
    "qwen2-tied-window-off": Case(
        "Qwen2Config",
        "Qwen2ForCausalLM",
        # Qwen2.5's own configs name a window but switch it off.
        dict(tie_word_embeddings=True, use_sliding_window=False, sliding_window=32, max_window_layers=1),
    ),
    "qwen3": Case("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, rope_theta=1e6)),
    "qwen3-bias-mqa": Case(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(head_dim=24, num_key_value_heads=1, attention_bias=True),
    ),
    "mistral-window": Case("MistralConfig", "MistralForCausalLM", dict(sliding_window=9)),
    "qwen2-window": Case(
        "Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=7, max_window_layers=1)
    ),
    "phi3": Case("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=4)),
    "phi3-window": Case("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=11)),
    "phi3-gqa": Case("Phi3Config", "Phi3ForCausalLM", dict()),
    "gemma2": Case(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        # Caps low enough to bend these small scores and logits.
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=256,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),  # fmt: skip
    "gemma2-window": Case(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        # Layer 0 slides (every other layer, from the first), layer 1 attends to everything.
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=6,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),  # fmt: skip
    "gemma3-text-window": Case(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=32, sliding_window=10, layer_types=["full_attention", "sliding_attention"]),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
    "gemma3-text": Case(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(head_dim=32, sliding_window=256, layer_types=["sliding_attention", "full_attention"]),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
    # Mixture-of-Experts: 4 experts, top-2, as small as the dense cases. The native backend runs the experts through
    # the torch path and the rest op by op (both logged).
    "mixtral": Case(
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
    "mixtral-window": Case(
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=9),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
    "qwen3-moe": Case(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, head_dim=32, norm_topk_prob=True),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
    "qwen3-moe-unnormalised-dense-layer": Case(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        # Top-3 of 6 weights as the softmax gives them; layer 0 dense (decoder_sparse_step 2), layer 1 sparse.
        dict(
            num_experts=6,
            num_experts_per_tok=3,
            moe_intermediate_size=40,
            head_dim=16,
            norm_topk_prob=False,
            decoder_sparse_step=2,
        ),
        has_native_forward=False,
        has_reference_only_ops=True,
    ),
}
PROMPT_LENGTHS = [1, 3, 8, 13, 22]
NUM_NEW_TOKENS = 10


def make_checkpoint(out_dir: Path, config_class: str, model_class: str, overrides: dict, seed: int = 0) -> Path:
    """Saves a random-weight transformers model of the family (plus a small tokenizer) to out_dir."""
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**TINY, **overrides})
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # wider than the default init (less flat logits); norms and biases away from 1 and 0
        for name, param in model.named_parameters():
            if param.dim() >= 2:  # matrices, and the stacked experts of MoE families
                param.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(1.0, 0.1)
    model.save_pretrained(out_dir)
    tokenizer = demo_text.train_tokenizer(demo_text.zen_text(), vocab_size=300)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(demo_text.tokenizer_config(256)))
    return out_dir


class Checkpoint(NamedTuple):
    model_dir: Path
    greedy: list[list[int]]  # transformers' greedy outputs for prompts_for(name)
    logits: torch.Tensor  # [len(last prompt), vocab] float32: transformers' logits over the last prompt


@pytest.fixture(scope="module")
def family_checkpoint(tmp_path_factory):
    built: dict[str, Checkpoint] = {}

    def make(name: str) -> Checkpoint:
        """The family's checkpoint and what transformers makes of it, built once per module."""
        if name not in built:
            case = CASES[name]
            model_dir = make_checkpoint(
                tmp_path_factory.mktemp(name), case.config_class, case.model_class, case.overrides
            )
            from transformers import AutoModelForCausalLM

            hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            prompts = prompts_for(name)
            with torch.no_grad():
                logits = hf_model(torch.tensor([prompts[-1]])).logits[0].float()
            built[name] = Checkpoint(model_dir, hf_greedy(hf_model, prompts, NUM_NEW_TOKENS), logits)
        return built[name]

    return make


def prompts_for(name: str) -> list[list[int]]:
    gen = torch.Generator().manual_seed(len(name))
    return [torch.randint(3, 384, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
