"""RMSNorm over the last dim, fusing the residual add that precedes it; Gemma's form scales by (1 + weight)."""

from __future__ import annotations

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps


class RMSNorm(nn.Module):
    """x / rms(x) * (weight + offset): offset 0 for Llama-style checkpoints, 1 for Gemma's, whose stored weights
    are the difference from 1."""

    def __init__(self, hidden_size: int, eps: float, ops: KernelOps, offset: float = 0.0):
        super().__init__()
        self.ops, self.eps, self.offset = ops, eps, offset
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def scale(self) -> torch.Tensor:
        """[hidden] the factor each normalised row is multiplied by (float32 when offset, as Gemma computes it)."""
        return self.weight if not self.offset else self.weight.float() + self.offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rms_norm(x, self.scale(), self.eps, residual)  # (normed [T, H], x + residual [T, H])
