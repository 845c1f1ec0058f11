"""The model families the runtime serves: a table from a checkpoint's model_type (or, lacking one, its
architectures) to the family's config reader and decoder class. Adding a family is its module plus a row here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.model_config import (
    ConfigError,
    ModelConfig,
    as_ids,
    read_rope,
    refuse_quantized_checkpoint,
    resolve_dtype,
)

from . import gemma, llama, moe, phi3, qwen2, qwen3


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # config.json's `architectures` this family reads
    model_class: type[nn.Module]  # built as model_class(config, ops)
    config_fields: Callable[[dict], dict]  # config.json -> family-specific ModelConfig fields; raises ConfigError


LLAMA = Family("llama", ("LlamaForCausalLM", "MistralForCausalLM"), llama.LlamaModel, llama.config_fields)

# model_type -> family. Sizes are data (config.json), never subclasses.
FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": Family("qwen2", ("Qwen2ForCausalLM",), llama.LlamaModel, qwen2.config_fields),
    "qwen3": Family("qwen3", ("Qwen3ForCausalLM",), llama.LlamaModel, qwen3.config_fields),
    "phi3": Family("phi3", ("Phi3ForCausalLM",), llama.LlamaModel, phi3.config_fields),
    "gemma2": Family("gemma2", ("Gemma2ForCausalLM",), gemma.GemmaModel, gemma.gemma2_config_fields),
    "gemma3_text": Family("gemma3_text", ("Gemma3ForCausalLM",), gemma.GemmaModel, gemma.gemma3_config_fields),
    "mixtral": Family("mixtral", ("MixtralForCausalLM",), moe.MoeModel, moe.mixtral_config_fields),
    "qwen3_moe": Family("qwen3_moe", ("Qwen3MoeForCausalLM",), moe.MoeModel, moe.qwen3_moe_config_fields),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
FAMILIES_BY_NAME = {family.name: family for family in FAMILIES.values()}


def find_family(hf: dict) -> Family:
    """The family of a config.json, by model_type, else by its first architecture; ConfigError naming the
    supported types when there is none."""
    model_type = hf.get("model_type")
    if model_type is None:
        by_architecture = {arch: family for family in FAMILIES.values() for arch in family.architectures}
        architectures = hf.get("architectures") or []
        if architectures and architectures[0] in by_architecture:
            return by_architecture[architectures[0]]
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return FAMILIES[model_type]


def build_model(config: ModelConfig, ops: KernelOps) -> nn.Module:
    """The family's decoder for config, its parameters uninitialised until weights are loaded."""
    return FAMILIES_BY_NAME[config.family].model_class(config, ops)


def read_config_dir(model_dir: str | Path, dtype: str | torch.dtype | None = None) -> ModelConfig:
    """Reads config.json (and generation_config.json for extra EOS ids) from a checkpoint directory."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir} has no config.json")
    hf = json.loads(path.read_text())
    gen_path = model_dir / "generation_config.json"
    generation = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    return read_config(hf, name=model_dir.name, dtype=dtype, generation=generation)


def read_config(
    hf: dict, name: str = "model", dtype: str | torch.dtype | None = None, generation: dict | None = None
) -> ModelConfig:
    """The ModelConfig of a config.json: the fields every family shares, then the family's own reading."""
    family = find_family(hf)
    refuse_quantized_checkpoint(hf)
    num_heads = hf["num_attention_heads"]
    hidden_size = hf["hidden_size"]
    theta, scaling = read_rope(hf)
    eos_ids = as_ids(hf.get("eos_token_id")) + as_ids((generation or {}).get("eos_token_id"))
    fields = dict(
        name=name,
        vocab_size=hf["vocab_size"],
        hidden_size=hidden_size,
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hidden_size // num_heads,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        dtype=resolve_dtype(dtype if dtype is not None else hf.get("dtype") or hf.get("torch_dtype")),
        eos_token_ids=list(dict.fromkeys(eos_ids)),
        bos_token_id=hf.get("bos_token_id"),
        rope_scaling=scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        family=family.name,
    )
    fields.update(family.config_fields(hf))  # the family's own fields, and its reading of shared ones
    return ModelConfig(**fields)
