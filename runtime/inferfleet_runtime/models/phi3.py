"""Phi-3 (`Phi3ForCausalLM`): the Llama decoder, its checkpoint storing q/k/v and gate/up already fused
(qkv_proj, gate_up_proj, in the row order the runtime's fused layers use). LongRoPE (the 128k variants) and
partial rotary embeddings are refused by the config reader."""

from __future__ import annotations

from ..config import refuse_sliding_window


def config_fields(hf: dict) -> dict:
    refuse_sliding_window(hf, [True])
    return {}
