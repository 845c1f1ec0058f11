"""Gated MLP: down(act(gate(x)) * up(x)) with gate and up fused into one matmul; act SiLU (SwiGLU) or tanh-GELU
(GeGLU, Gemma)."""

from __future__ import annotations

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps
from inferfleet_runtime.kernels.activation import gelu_tanh_and_mul_reference
from inferfleet_runtime.model_config import ModelConfig

ACTIVATIONS = ("silu", "gelu_tanh")


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        assert config.hidden_act in ACTIVATIONS, "the family's config reader refuses other activations"
        # GeGLU has only its torch reference: every backend runs it (the model logs that at load).
        self.act_and_mul = ops.silu_and_mul if config.hidden_act == "silu" else gelu_tanh_and_mul_reference
        # gate and up projections fused: rows [0, I) gate, [I, 2I) up.
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))  # [T, 2I] -> [T, I] -> [T, hidden]
