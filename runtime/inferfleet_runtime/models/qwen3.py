"""Qwen3 (`Qwen3ForCausalLM`, dense): the Llama decoder with each head's q and k RMS-normalised over head_dim
before RoPE, an explicit head_dim (often not hidden_size / num_heads) and attention_bias on q, k, v and o."""

from __future__ import annotations

from inferfleet_runtime.model_config import read_sliding_windows

from .qwen2 import qwen_sliding_layers


def config_fields(hf: dict) -> dict:
    return {"qk_norm": True, **read_sliding_windows(hf, qwen_sliding_layers(hf))}
