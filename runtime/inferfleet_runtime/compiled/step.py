"""StaticStep: one decoder step of the loaded model over static per-slot KV buffers, in shapes fixed per bucket.

The step runs the runtime model's own forward (models/) with a `StaticSlotAttention` in place of the paged one:
instead of paged blocks it reads each sequence's slot of a static buffer
kv_cache [num_layers, 2, max_batch_size, max_context_length, Hkv, D]. The buffer is an input, never written
inside the graph: the step returns the new tokens' K/V and the runner stores them (one indexed copy for all
layers), so every backend sees a pure function.
"""

from __future__ import annotations

import torch
from torch import nn

from inferfleet_runtime.kernels.paged_attention import softcapped_attention


class StaticSlotAttention:
    """One step's attention over static KV slots for a [B, L] grid of new tokens (row b: slot slot_ids[b]).

    Row b's new tokens sit at positions start_pos[b] + 0..L-1, the first num_new[b] real and the rest padding;
    a query sees its slot's cached keys before start_pos[b] and the real new keys up to itself (in a sliding-window
    layer, only the last `window` of those positions). The new K/V of every layer are collected in `new_kv` for the
    runner to store.
    """

    def __init__(
        self,
        kv_cache: torch.Tensor,
        slot_ids: torch.Tensor,
        start_pos: torch.Tensor,
        num_new: torch.Tensor,
        length: int,
    ):
        batch, max_context_length = slot_ids.shape[0], kv_cache.shape[3]
        self.batch, self.length = batch, length
        device = kv_cache.device
        offsets = torch.arange(length, device=device)
        sees_cache = torch.arange(max_context_length, device=device)[None, :] < start_pos[:, None]  # [B, C]
        sees_new = (offsets[None, :, None] >= offsets[None, None, :]) & (
            offsets[None, None, :] < num_new[:, None, None]
        )  # [B, L, L]
        self.mask = torch.cat((sees_cache[:, None, :].expand(batch, length, -1), sees_new), dim=-1)  # [B, L, C + L]
        # Positions of the queries [B, L] and of the keys [B, C + L] (cache column c holds position c), and the
        # padding rows [B, L], which keep their causal mask in a window so that no row's softmax is empty.
        self.q_pos = start_pos[:, None] + offsets[None, :]
        self.k_pos = torch.cat((torch.arange(max_context_length, device=device).expand(batch, -1), self.q_pos), dim=1)
        self.is_padding = offsets[None, :] >= num_new[:, None]
        self.window_masks: dict[int, torch.Tensor] = {}
        self.cache = kv_cache[:, :, slot_ids]  # [layers, 2, B, C, Hkv, D]
        self.new_kv: list[torch.Tensor] = []  # per layer [2, B, L, Hkv, D]

    def forward(
        self,
        layer_index: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        softcap: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        assert layer_index == len(self.new_kv), "layers run in order, once each"
        num_tokens, num_heads, head_dim = q.shape
        batch, length, num_kv_heads, dtype = self.batch, self.length, k.shape[1], q.dtype
        k = k.view(batch, length, num_kv_heads, head_dim)  # [B, L, Hkv, D]
        v = v.view(batch, length, num_kv_heads, head_dim)
        self.new_kv.append(torch.stack((k, v)))
        keys = torch.cat((self.cache[layer_index, 0], k), dim=1)  # [B, C + L, Hkv, D]
        values = torch.cat((self.cache[layer_index, 1], v), dim=1)
        q = q.view(batch, length, num_heads, head_dim).float().transpose(1, 2)  # [B, Hq, L, D]
        keys, values = keys.float().transpose(1, 2), values.float().transpose(1, 2)  # [B, Hkv, C + L, D]
        mask = self.mask if window is None else self._window_mask(window)
        if softcap is not None:
            bias = torch.zeros(mask.shape, device=q.device).masked_fill(~mask, float("-inf"))[:, None]
            out = softcapped_attention(q, keys, values, bias, scale, softcap)
        else:
            group = num_heads // num_kv_heads
            if group > 1:  # each kv head serves `group` query heads
                keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask[:, None], scale=scale
            )  # [B, Hq, L, D]
        return out.transpose(1, 2).reshape(num_tokens, num_heads, head_dim).to(dtype)

    def _window_mask(self, window: int) -> torch.Tensor:
        """self.mask [B, L, C + L] less, for real rows, the keys window or more positions before the query."""
        if window not in self.window_masks:
            in_window = self.k_pos[:, None, :] > self.q_pos[:, :, None] - window  # [B, L, C + L]
            self.window_masks[window] = self.mask & (in_window | self.is_padding[:, :, None])
        return self.window_masks[window]


class StaticStep(nn.Module):
    def __init__(self, model: nn.Module, max_context_length: int):
        super().__init__()
        assert model.ops.backend == "reference", "export traces the torch reference ops"
        self.model = model
        self.max_context_length = max_context_length

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
        batch, length = input_ids.shape
        offsets = torch.arange(length, device=input_ids.device)
        # Padding rows may run past the context; their outputs are dropped, the clamp keeps the RoPE lookup valid.
        positions = (start_pos[:, None] + offsets[None, :]).clamp(max=self.max_context_length - 1)  # [B, L]
        attn = StaticSlotAttention(kv_cache, slot_ids, start_pos, num_new, length)
        h = self.model(input_ids.reshape(-1), positions.reshape(-1), attn)  # [T, hidden], T = B * L
        last = h.view(batch, length, -1)[torch.arange(batch, device=h.device), num_new - 1]  # [B, hidden]
        return self.model.compute_logits(last), torch.stack(attn.new_kv)


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
