"""The model families the runtime serves: a table from a checkpoint's model_type (or, lacking one, its
architectures) to the family's config reader and decoder class. Adding a family is its module plus a row here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..config import ConfigError, ModelConfig
from ..kernels import KernelOps
from . import gemma, llama, phi3, qwen2, qwen3


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
