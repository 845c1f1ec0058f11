"""Llama-shaped decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a KV cache given from outside; the
Llama and Mistral families, and the decoder the Qwen2, Qwen3 and Phi-3 families build too (their differences are
ModelConfig flags the layers read: q/k/v biases, per-head q/k norms)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps, native
from inferfleet_runtime.layers.attention import Attention
from inferfleet_runtime.layers.attention_backend import AttentionBackend, PagedAttention
from inferfleet_runtime.layers.linear import NativeLinear, NativeQuantizedLinear
from inferfleet_runtime.layers.mlp import GatedMLP
from inferfleet_runtime.layers.norm import RMSNorm
from inferfleet_runtime.layers.quantized import QuantizedEmbedding
from inferfleet_runtime.layers.rotary import rope_cos_sin_cache
from inferfleet_runtime.model_config import ModelConfig, read_sliding_windows

log = logging.getLogger(__name__)


def config_fields(hf: dict) -> dict:
    """Llama and Mistral: the common fields, and Mistral's sliding_window on every layer (4096 where its config.json
    has no such key, null meaning none)."""
    default = 4096 if hf.get("model_type") == "mistral" else None
    return read_sliding_windows(hf, [True] * hf["num_hidden_layers"], default)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, ops, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = self.make_mlp(config, ops, layer_index)

    def make_mlp(self, config: ModelConfig, ops: KernelOps, layer_index: int) -> nn.Module:
        """The layer's MLP: dense here; a Mixture-of-Experts family gives some layers a sparse one."""
        return GatedMLP(config, ops)

    def forward(self, h, residual, positions, cos_sin_cache, attn: AttentionBackend):
        # The residual stream is carried separately so each norm fuses the preceding residual add.
        x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(x, positions, cos_sin_cache, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    layer_class: type[nn.Module] = DecoderLayer  # a family with another layer order names its own

    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        self.config, self.ops = config, ops
        # Built on the meta device (the loader), the embedding skips its random init: normal_ on meta imports
        # torch's symbolic shapes, dynamo and Triton (memory resident for the server's life) for numbers never read.
        on_meta = torch.get_default_device().type == "meta"
        weight = torch.empty(config.vocab_size, config.hidden_size) if on_meta else None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(self.layer_class(config, ops, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops, config.norm_offset)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        # Set by enable_native_forward for the native kernels: the decoder stack of a paged step as one C call.
        self.native_weights: native.DecoderWeights | None = None
        # What keeps this instance (not its family) off the whole-stack native forward (layers.parallel sets it).
        self.native_forward_blockers: list[str] = []

    def init_rope(self) -> None:
        """Builds the RoPE table on the model's device (call after the weights are in place)."""
        c = self.config
        self.cos_sin_cache = rope_cos_sin_cache(
            c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings, self.norm.weight.device
        )

    def native_forward_gaps(self) -> list[str]:
        """What of this model native.c's whole-stack forward cannot compute (empty when it runs all of it)."""
        return []

    def enable_native_forward(self) -> None:
        """Serves paged steps through native.forward once every linear is a NativeLinear (layers.pack_linears
        calls this), or logs why the layers keep running op by op on the native kernels."""
        gaps = self.native_forward_gaps() + self.native_forward_blockers
        if gaps:
            log.info(
                "Kept %s (family %s) op by op on the native kernels: the whole-stack native forward has no %s",
                self.config.name, self.config.family, ", ".join(gaps),
            )  # fmt: skip
            return
        self.native_weights = native_decoder_weights(self)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> hidden states [T, hidden] (final norm applied).

        attn holds the step's KV cache and attention (paged when serving, static slots when exported).
        """
        if self.native_weights is not None and isinstance(attn, PagedAttention):
            meta = attn.meta
            return native.forward(
                self.native_weights, attn.kv_caches, input_ids, positions, meta.slot_mapping, meta.block_tables,
                meta.seq_lens, meta.query_start_loc,
            )  # fmt: skip
        h = self.embed_tokens(input_ids)  # [T, hidden]
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, positions, self.cos_sin_cache, attn)
        h, _ = self.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # [N, hidden] -> [N, vocab] float32


def native_decoder_weights(model: LlamaModel) -> native.DecoderWeights:
    """The model's decoder stack for native.forward, once every linear of its layers is a NativeLinear or a
    NativeQuantizedLinear."""

    def packed(linear: nn.Module) -> torch.Tensor | native.QuantizedWeight:
        if isinstance(linear, NativeQuantizedLinear):
            return linear.packed
        assert isinstance(linear, NativeLinear), "pack_linears replaces every linear first"
        return linear.weight

    layers = [
        {
            "input_norm": layer.input_layernorm.weight.detach(),
            "qkv": packed(layer.self_attn.qkv_proj),
            "qkv_bias": layer.self_attn.qkv_proj.bias,
            "o": packed(layer.self_attn.o_proj),
            "o_bias": layer.self_attn.o_proj.bias,
            "post_norm": layer.post_attention_layernorm.weight.detach(),
            "gate_up": packed(layer.mlp.gate_up_proj),
            "gate_up_bias": layer.mlp.gate_up_proj.bias,
            "down": packed(layer.mlp.down_proj),
            "down_bias": layer.mlp.down_proj.bias,
            "q_norm": None if layer.self_attn.q_norm is None else layer.self_attn.q_norm.weight.detach(),
            "k_norm": None if layer.self_attn.k_norm is None else layer.self_attn.k_norm.weight.detach(),
        }
        for layer in model.layers
    ]
    config = model.config
    return native.DecoderWeights(
        layers=layers, **embedding_rows(model.embed_tokens), final_norm=model.norm.weight.detach(),
        cos_sin=model.cos_sin_cache, num_q_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim, intermediate=config.intermediate_size, eps=config.rms_norm_eps,
        scale=model.layers[0].self_attn.scale, windows=[config.window_of(i) for i in range(config.num_layers)],
    )  # fmt: skip


def embedding_rows(embedding: nn.Module) -> dict:
    """The native forward's embedding arguments: the float table, or a QuantizedEmbedding's int8 rows and scales."""
    if isinstance(embedding, QuantizedEmbedding):
        return {"embed": embedding.qweight, "embed_scales": embedding.scales.view(-1)}
    return {"embed": embedding.weight.detach()}
