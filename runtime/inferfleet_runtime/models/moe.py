"""Mixture-of-Experts families: Mixtral (`MixtralForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`). The Llama
decoder with each sparse layer's MLP replaced by routed SwiGLU experts (layers/moe.py).

- Mixtral: every layer sparse; softmax over all experts, top-k, the k weights renormalised; sliding_window on
  every layer (null, no window, in the released configs).
- Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm, explicit head_dim); the top-k weights renormalised only
  with norm_topk_prob; layer i is sparse when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0,
  the others keep a dense MLP of intermediate_size; sliding_window on every layer when use_sliding_window.

The native backend has no experts kernel: sparse layers run the torch CPU path and the whole-stack native forward
is not used (both logged once at load). --quantization int8|int4 is refused for these families (layers/quantized)."""

from __future__ import annotations

import logging

from torch import nn

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.layers.mlp import GatedMLP
from inferfleet_runtime.layers.moe import SparseMoE
from inferfleet_runtime.model_config import ConfigError, ModelConfig, read_sliding_windows

from .llama import DecoderLayer, LlamaModel

log = logging.getLogger(__name__)


def mixtral_config_fields(hf: dict) -> dict:
    num_layers = hf["num_hidden_layers"]
    return {
        **_moe_fields(
            hf, hf.get("num_local_experts", 8), hf.get("num_experts_per_tok", 2), hf["intermediate_size"],
            renormalize=True, moe_layers=tuple(range(num_layers)),
        ),
        **read_sliding_windows(hf, [True] * num_layers),
    }  # fmt: skip


def qwen3_moe_config_fields(hf: dict) -> dict:
    num_layers = hf["num_hidden_layers"]
    num_experts = hf.get("num_experts", hf.get("num_local_experts", 128))
    step = hf.get("decoder_sparse_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ConfigError(f"decoder_sparse_step must be a positive integer, got {step!r}")
    dense = hf.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in dense):
        raise ConfigError(f"mlp_only_layers must list layer indices below num_hidden_layers, got {dense!r}")
    moe_layers = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0) if num_experts else ()
    return {
        "qk_norm": True,
        **_moe_fields(
            hf, num_experts, hf.get("num_experts_per_tok", 8), hf.get("moe_intermediate_size", 768),
            renormalize=bool(hf.get("norm_topk_prob", False)), moe_layers=moe_layers,
        ),
        **read_sliding_windows(hf, [bool(hf.get("use_sliding_window"))] * num_layers, default=4096),
    }  # fmt: skip


def _moe_fields(hf: dict, num_experts, top_k, intermediate, renormalize: bool, moe_layers: tuple[int, ...]) -> dict:
    activation = hf.get("hidden_act", "silu")
    if activation != "silu":
        raise ConfigError(f"activation {activation!r} is not supported for experts (supported: silu)")
    for field, value in (("number of experts", num_experts), ("moe intermediate size", intermediate)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"the {field} must be a non-negative integer, got {value!r}")
    if moe_layers and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts):
        raise ConfigError(f"num_experts_per_tok must be between 1 and the {num_experts} experts, got {top_k!r}")
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": intermediate,
        "norm_topk_prob": renormalize,
        "moe_layers": moe_layers,
    }


class MoeDecoderLayer(DecoderLayer):
    def make_mlp(self, config: ModelConfig, ops: KernelOps, layer_index: int) -> nn.Module:
        return SparseMoE(config, ops) if layer_index in config.moe_layers else GatedMLP(config, ops)


class MoeModel(LlamaModel):
    layer_class = MoeDecoderLayer

    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__(config, ops)
        if config.moe_layers and ops.backend == "native":
            log.info(
                "Chose the torch reference ops for the fused experts of %s (family %s): the native kernels have "
                "no grouped experts kernel (a torch loop over the experts that get tokens runs each one's rows "
                "through native.c's matmul once the linears are packed)",
                config.name, config.family,
            )  # fmt: skip

    def native_forward_gaps(self) -> list[str]:
        return ["sparse Mixture-of-Experts MLPs"] if self.config.moe_layers else []

    def enable_native_forward(self) -> None:
        """Packs every sparse layer's experts for native.c's matmul, then (for a model with no sparse layer) the
        whole-stack forward, else logs why the layers stay op by op."""
        for layer in self.layers:
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.pack_for_native()
        super().enable_native_forward()
