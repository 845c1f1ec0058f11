"""Phi-3 (`Phi3ForCausalLM`): the Llama decoder, its checkpoint storing q/k/v and gate/up already fused
(qkv_proj, gate_up_proj, in the row order the runtime's fused layers use). LongRoPE (the 128k variants) and
partial rotary embeddings are refused by the config reader; sliding_window (Phi-3-mini-4k's 2047) applies to every
layer."""

from __future__ import annotations

from inferfleet_runtime.model_config import read_sliding_windows


def config_fields(hf: dict) -> dict:
    return read_sliding_windows(hf, [True] * hf["num_hidden_layers"])
