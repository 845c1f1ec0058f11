"""StaticStep: one decoder step of the loaded model over static per-slot KV buffers, in shapes fixed per bucket.

The module reuses the runtime model's own submodules and weights (embedding, norms, projections, MLP,
lm_head, RoPE table) and replaces only attention: instead of paged blocks it reads each sequence's
slot of a static buffer kv_cache [num_layers, 2, max_batch_size, max_context_length, Hkv, D]. The
buffer is an input, never written inside the graph: the step returns the new tokens' K/V and the
runner stores them (one indexed copy for all layers), so every backend sees a pure function.
"""

from __future__ import annotations

import torch
from torch import nn

from inferfleet_runtime.model import LlamaModel


class StaticStep(nn.Module):
    def __init__(self, model: LlamaModel, max_context_length: int):
        super().__init__()
        assert model.layers[0].self_attn.ops.backend == "reference", "export traces the torch reference ops"
        self.model = model
        self.max_context_length = max_context_length
        attn = model.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale

    def forward(
        self,
        input_ids: torch.Tensor,
        start_pos: torch.Tensor,
        num_new: torch.Tensor,
        slot_ids: torch.Tensor,
        kv_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, L] int64: row b holds num_new[b] new tokens (the rest padding) at positions
        start_pos[b] + 0..L-1 of the sequence in slot slot_ids[b]; kv_cache holds positions < start_pos[b].
        Returns logits [B, vocab] float32 at each row's last new token and new_kv [num_layers, 2, B, L, Hkv, D]."""
        model = self.model
        batch, length = input_ids.shape
        offsets = torch.arange(length, device=input_ids.device)
        positions = (start_pos[:, None] + offsets[None, :]).clamp(max=self.max_context_length - 1)  # [B, L]
        # Key visibility: cached keys before start_pos; new keys causally, and only real (non-padding) ones.
        sees_cache = torch.arange(self.max_context_length, device=input_ids.device)[None, :] < start_pos[:, None]
        sees_new = (offsets[None, :, None] >= offsets[None, None, :]) & (
            offsets[None, None, :] < num_new[:, None, None]
        )
        mask = torch.cat((sees_cache[:, None, :].expand(batch, length, -1), sees_new), dim=-1)  # [B, L, C + L]
        cache = kv_cache[:, :, slot_ids]  # [layers, 2, B, C, Hkv, D]
        h = model.embed_tokens(input_ids.reshape(-1))  # [T, hidden], T = B * L
        residual = None
        new_kv = []
        for i, layer in enumerate(model.layers):
            x, residual = layer.input_layernorm(h, residual)
            x, k, v = self._attention(layer.self_attn, x, positions, cache[i], mask, batch, length)
            new_kv.append(torch.stack((k, v)))  # [2, B, L, Hkv, D]
            x, residual = layer.post_attention_layernorm(x, residual)
            h = layer.mlp(x)
        h, _ = model.norm(h, residual)
        last = h.view(batch, length, -1)[torch.arange(batch, device=h.device), num_new - 1]  # [B, hidden]
        return model.lm_head(last).float(), torch.stack(new_kv)

    def _attention(self, attn, x, positions, layer_cache, mask, batch, length):
        num_tokens = x.shape[0]
        q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = attn.ops.rotary(q, k, positions.reshape(-1), self.model.cos_sin_cache)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        keys = torch.cat((layer_cache[0], k), dim=1)  # [B, C + L, Hkv, D]
        values = torch.cat((layer_cache[1], v), dim=1)
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            keys, values = keys.repeat_interleave(group, dim=2), values.repeat_interleave(group, dim=2)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.view(batch, length, self.num_heads, self.head_dim).float().transpose(1, 2),
            keys.float().transpose(1, 2),
            values.float().transpose(1, 2),
            attn_mask=mask[:, None],
            scale=self.scale,
        )  # [B, Hq, L, D]
        out = out.transpose(1, 2).reshape(num_tokens, attn.q_size).to(x.dtype)
        return attn.o_proj(out), k, v


def example_inputs(kind: str, bucket: int, kv_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Inputs of the bucket's shapes: decode [bucket, 1] over bucket slots, prefill [1, bucket] over slot 0."""
    device = kv_cache.device
    batch, length = (bucket, 1) if kind == "decode" else (1, bucket)
    num_slots = kv_cache.shape[2]
    return (
        torch.zeros(batch, length, dtype=torch.int64, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
        torch.full((batch,), length, dtype=torch.int64, device=device),
        torch.arange(batch, dtype=torch.int64, device=device) % num_slots,
        kv_cache,
    )
