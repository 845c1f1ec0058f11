"""Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): the Llama decoder with biases on q, k and v (not on o)."""

from __future__ import annotations

from inferfleet_runtime.model_config import read_sliding_windows


def config_fields(hf: dict) -> dict:
    return {"qkv_bias": True, **read_sliding_windows(hf, qwen_sliding_layers(hf))}


def qwen_sliding_layers(hf: dict) -> list[bool]:
    """Which layers attend through sliding_window: none unless use_sliding_window is set (Qwen2.5's configs name
    a window but switch it off); then as layer_types says, else every layer from max_window_layers on."""
    if not hf.get("use_sliding_window"):
        return [False] * hf["num_hidden_layers"]
    if hf.get("layer_types"):
        return [kind == "sliding_attention" for kind in hf["layer_types"]]
    first = hf.get("max_window_layers", 28)
    return [i >= first for i in range(hf["num_hidden_layers"])]
