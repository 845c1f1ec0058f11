"""Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): the Llama decoder with biases on q, k and v (not on o)."""

from __future__ import annotations

from ..config import refuse_sliding_window


def config_fields(hf: dict) -> dict:
    refuse_sliding_window(hf, qwen_sliding_layers(hf))
    return {"qkv_bias": True}


def qwen_sliding_layers(hf: dict) -> list[bool]:
    """Which layers attend through sliding_window: as layer_types says, else (configs before layer_types) every
    layer from max_window_layers on, and only when use_sliding_window is set."""
    if hf.get("layer_types"):
        return [kind == "sliding_attention" for kind in hf["layer_types"]]
    first = hf.get("max_window_layers", 28)
    return [bool(hf.get("use_sliding_window")) and i >= first for i in range(hf["num_hidden_layers"])]
