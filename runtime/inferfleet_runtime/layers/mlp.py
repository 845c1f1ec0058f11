"""Gated MLP: down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..kernels import KernelOps


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        self.ops = ops
        # gate and up projections fused: rows [0, I) gate, [I, 2I) up.
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))  # [T, 2I] -> [T, I] -> [T, hidden]
