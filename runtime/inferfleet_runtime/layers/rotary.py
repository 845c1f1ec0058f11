"""RoPE tables: inverse frequencies (plain, linear or Llama-3 scaled) and the [positions, head_dim] cos/sin cache."""

from __future__ import annotations

import math

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, with linear or Llama-3 scaling when given."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
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


def rope_cos_sin_cache(
    head_dim: int, theta: float, scaling: dict | None, max_positions: int, device: torch.device
) -> torch.Tensor:
    """[max_positions, head_dim] float32: first half cos, second half sin of position * inv_freq."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * rope_inv_freq(head_dim, theta, scaling)[None, :]  # [max_pos, head_dim // 2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
