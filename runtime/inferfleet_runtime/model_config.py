"""ModelConfig: the fields of a Hugging Face decoder's config.json that the runtime uses (the family-specific ones
are read by the family's module in models/)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """A checkpoint's config.json describes something this runtime cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    dtype: torch.dtype
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"llama3", "factor": ..., ...}; None = plain RoPE
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q, k, v and o projections carry biases (Llama's flag)
    mlp_bias: bool = False
    family: str = "llama"  # the models/ family that builds the decoder (models.FAMILIES)
    qkv_bias: bool = False  # q, k and v carry biases even without attention_bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    # Gemma 2 and 3:
    hidden_act: str = "silu"  # the gated MLP's activation: "silu" or "gelu_tanh"
    norm_offset: float = 0.0  # RMSNorms scale by (offset + weight): 1 where checkpoints store weight - 1
    embed_scale: float | None = None  # embeddings multiplied by this (sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power instead of head_dim's
    attn_logit_softcapping: float | None = None  # scores -> tanh(scores / c) * c before the softmax
    final_logit_softcapping: float | None = None  # logits -> tanh(logits / c) * c
    local_rope_theta: float | None = None  # RoPE base of the layers in local_rope_layers (Gemma 3's sliding ones)
    local_rope_layers: tuple[int, ...] = ()
    # Per layer, a sliding-window layer's window (its queries see the last `window` keys, their own included) or
    # None for full attention; () when every layer attends to the whole context.
    sliding_windows: tuple[int | None, ...] = ()
    # Mixture-of-Experts (Mixtral, Qwen3-MoE): the layers in moe_layers replace the dense MLP by num_experts SwiGLU
    # experts of width moe_intermediate_size, each token routed to its num_experts_per_tok best (layers/moe.py).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # the top-k routing weights are renormalised to sum to 1
    moe_layers: tuple[int, ...] = ()

    def window_of(self, layer_index: int) -> int | None:
        """The sliding window of layer layer_index, None where it attends to the whole context."""
        return self.sliding_windows[layer_index] if self.sliding_windows else None


def refuse_quantized_checkpoint(hf: dict) -> None:
    """A checkpoint quantized by its producer is refused in one line unless it is compressed-tensors with int
    weights (compressed_checkpoint reads those). A float checkpoint can be quantized at load (`serve --quantization`)."""
    quantization = hf.get("quantization_config")
    if isinstance(quantization, dict) and quantization.get("quant_method") == "compressed-tensors":
        from inferfleet_runtime.checkpoints.compressed_tensors import read_scheme

        read_scheme(quantization)  # int weight-only schemes are read; any other raises, naming what it is
        return
    if quantization:
        method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else "unknown"
        fmt = quantization.get("format") if isinstance(quantization, dict) else None
        raise ConfigError(
            f"checkpoints quantized by their producer are not read yet (quantization_config: {method}"
            f"{f', format {fmt}' if fmt else ''}); serve a float checkpoint with --quantization int8|int4"
        )


def resolve_dtype(value: str | torch.dtype | None) -> torch.dtype:
    """torch dtype from a name ("float32", "float16", "bfloat16", "torch.float16"); float32 when unset."""
    if value is None or value == "auto":
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    key = str(value).removeprefix("torch.")
    if key not in DTYPES:
        raise ConfigError(f"dtype {value!r} is not supported (supported: {', '.join(DTYPES)})")
    return DTYPES[key]


def read_sliding_windows(hf: dict, is_sliding: list[bool], default: int | None = None) -> dict:
    """ModelConfig's sliding_windows field: config.json's sliding_window (default where the key is absent, as the
    family's transformers config has it) for the layers is_sliding marks, None for the others. A window at least
    max_position_embeddings long never drops a key, so it is full attention."""
    window = hf.get("sliding_window", default)
    if window is None or not any(is_sliding):
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"sliding_window must be a positive number of tokens, got {window!r}")
    if window >= hf.get("max_position_embeddings", 2048):
        return {}
    return {"sliding_windows": tuple(window if sliding else None for sliding in is_sliding)}


def read_rope(hf: dict) -> tuple[float, dict | None]:
    """(rope_theta, scaling or None) of a config.json's RoPE fields, refusing the kinds the runtime lacks."""
    # Older configs carry rope_theta + rope_scaling; transformers 5 writes rope_parameters with rope_theta inside.
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    merged = {**params, **scaling}
    theta = float(merged.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    partial = merged.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ConfigError(f"partial rotary embeddings (partial_rotary_factor={partial}) are not supported")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"rope type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if rope_type == "default":
        return theta, None
    merged["rope_type"] = rope_type
    if rope_type == "llama3":
        merged.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 2048))
    return theta, merged


def as_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
