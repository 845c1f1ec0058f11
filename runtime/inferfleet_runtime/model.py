"""Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a KV cache given from outside."""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import AttentionBackend, PagedAttention
from .config import ModelConfig
from .kernels import KernelOps, native


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, with linear or Llama-3 scaling when configured."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin_cache(config: ModelConfig, device: torch.device) -> torch.Tensor:
    """[max_position_embeddings, head_dim] float32: first half cos, second half sin of position * inv_freq."""
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
    freqs = positions[:, None] * rope_inv_freq(config)[None, :]  # [max_pos, head_dim // 2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


# Rows the packed layout is chosen for: at 32 the layout served batch 1 and 128 within 6% of their own best
# (33 matmuls of the `bench compare` model, 2 threads).
PACKED_LINEAR_BATCH_HINT = 32
# Smallest weight packed (elements; 512 x 512 = 1 MiB in float32). Each oneDNN call costs ~25-40 us more than MKL's
# for a matrix that stays in cache: on the 96-wide demo model, packing every linear took the offline paged engine
# from 4,545-4,770 to 2,348-3,455 tok/s (one thread); the `bench compare` model's smallest weight is 512 x 512.
PACKED_LINEAR_MIN_WEIGHT = 512 * 512


class PackedLinear(nn.Module):
    """nn.Linear (x W^T + b over [T, in] rows) for float32 on a CPU, its weight reordered once into oneDNN's
    blocked layout: on the `bench compare` model the step's 33 matmuls took 5.3 ms at batch 1 and 15.1 ms at
    batch 32 this way, against 8.6 and 26.2 ms through nn.Linear (2 threads, quiet machine).

    `torch.ops.mkldnn` is PyTorch's own oneDNN binding (what inductor's CPU backend calls), not a public API:
    `pack_linears` checks that it is there and leaves nn.Linear in place when it is not.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKED_LINEAR_BATCH_HINT)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")  # [T, out]


def can_pack_linears(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class NativeLinear(nn.Module):
    """nn.Linear (x W^T + b over [T, in] rows) for the native kernel backend: its weight repacked once into the
    panels of native.c's matmul, which streams each weight once per call and keeps a block of rows in registers
    (kernels/native.py `linear`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features = linear.out_features
        self.register_buffer("weight", native.pack_linear(linear.weight.detach().contiguous()))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x if x.stride(-1) == 1 else x.contiguous()
        return native.linear(x, self.weight, self.bias, self.out_features)  # [T, out]


def pack_linears(model: nn.Module, min_weight: int = PACKED_LINEAR_MIN_WEIGHT) -> int:
    """Replaces the nn.Linear layers of a float32 CPU model for serving (the packed weights are opaque, so export
    and weight loading use the model before this): every one by a NativeLinear when the model runs the native
    kernels, else each whose weight has at least min_weight elements by a PackedLinear (oneDNN). Returns how many
    were replaced."""
    native_backend = getattr(getattr(model, "ops", None), "backend", None) == "native"
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (native_backend or module.weight.numel() >= min_weight)
    ]
    if not targets:
        return 0
    device, dtype = targets[0][1].weight.device, targets[0][1].weight.dtype
    if native_backend:  # kernels.get_ops gives the native backend only to float32 models on a CPU
        replacement = NativeLinear
    elif can_pack_linears(device, dtype):
        replacement = PackedLinear
    else:
        return 0
    for name, module in targets:
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, replacement(module))
    if native_backend and isinstance(model, LlamaModel):
        model.native_weights = native_decoder_weights(model)
    return len(targets)


def native_decoder_weights(model: LlamaModel) -> native.DecoderWeights:
    """The model's decoder stack for native.forward, once every linear of its layers is a NativeLinear."""

    def packed(linear: nn.Module) -> torch.Tensor:
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
        }
        for layer in model.layers
    ]
    config = model.config
    return native.DecoderWeights(
        layers=layers, embed=model.embed_tokens.weight.detach(), final_norm=model.norm.weight.detach(),
        cos_sin=model.cos_sin_cache, num_q_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim, intermediate=config.intermediate_size, eps=config.rms_norm_eps,
        scale=model.layers[0].self_attn.scale,
    )  # fmt: skip


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, layer_index: int):
        super().__init__()
        self.ops, self.layer_index = ops, layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        # q, k and v projections fused into one matmul; the loader fills the three row ranges.
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_bias)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # q: [T, Hq, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # k: [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # v: [T, Hkv, D]
        q, k = self.ops.rotary(q, k, positions, cos_sin_cache)
        out = attn.forward(self.layer_index, q, k, v, self.scale)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, self.q_size))  # [T, hidden]


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        self.ops = ops
        # gate and up projections fused: rows [0, I) gate, [I, 2I) up.
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))  # [T, 2I] -> [T, I] -> [T, hidden]


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, ops: KernelOps):
        super().__init__()
        self.ops, self.eps = ops, eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rms_norm(x, self.weight, self.eps, residual)  # (normed, x + residual)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, ops, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = MLP(config, ops)

    def forward(self, h, residual, positions, cos_sin_cache, attn: AttentionBackend):
        # The residual stream is carried separately so each norm fuses the preceding residual add.
        x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(x, positions, cos_sin_cache, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        self.config, self.ops = config, ops
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, ops, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        # Set by pack_linears for the native kernels: the decoder stack of a paged step as one C call.
        self.native_weights: native.DecoderWeights | None = None

    def init_rope(self) -> None:
        """Builds the RoPE table on the model's device (call after the weights are in place)."""
        self.cos_sin_cache = rope_cos_sin_cache(self.config, self.embed_tokens.weight.device)

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
