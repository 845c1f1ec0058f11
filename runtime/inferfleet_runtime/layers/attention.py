"""Self-attention of one decoder layer: fused q/k/v projection, optional per-head q/k RMSNorm, RoPE, the step's
attention backend (paged or static slots, scores optionally soft-capped, keys optionally within a sliding window),
output projection."""

from __future__ import annotations

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.layers.attention_backend import AttentionBackend
from inferfleet_runtime.model_config import ModelConfig

from .norm import RMSNorm


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, layer_index: int):
        super().__init__()
        self.ops, self.layer_index = ops, layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = (config.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.softcap = config.attn_logit_softcapping
        self.window = config.window_of(layer_index)
        # q, k and v projections fused into one matmul; the loader fills the three row ranges.
        qkv_bias = config.attention_bias or config.qkv_bias
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_bias)
        # Qwen3, Gemma 3: each head's q and k normalised over head_dim (one weight shared by the heads) before RoPE.
        eps, offset = config.rms_norm_eps, config.norm_offset
        self.q_norm = RMSNorm(self.head_dim, eps, ops, offset) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps, ops, offset) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q, _ = self.q_norm(q.reshape(num_tokens * self.num_heads, self.head_dim))  # [T * Hq, D]
            k, _ = self.k_norm(k.reshape(num_tokens * self.num_kv_heads, self.head_dim))  # [T * Hkv, D]
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # q: [T, Hq, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # k: [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # v: [T, Hkv, D]
        q, k = self.ops.rotary(q, k, positions, cos_sin_cache)
        out = attn.forward(self.layer_index, q, k, v, self.scale, self.softcap, self.window)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, self.q_size))  # [T, hidden]
