"""Rotary position embedding, rotate-half (Hugging Face Llama / GPT-NeoX) convention.

Math: with h = D/2, c = cache[pos, :h], s = cache[pos, h:], for each head vector v [D]:
    out[:h] = v[:h] * c - v[h:] * s
    out[h:] = v[h:] * c + v[:h] * s
computed in float32. Rope scaling (linear, dynamic, YaRN, Llama 3) is folded into the cos/sin cache
by the model, so this kernel only rotates.

Layouts: query [T, Hq, D], key [T, Hkv, D] (last dim contiguous; token and head strides free, so a
view into a fused qkv projection works); positions [T] int64; cos_sin_cache [max_pos, D] float32.
Outputs are new contiguous tensors of the same shapes; inputs are not modified.
Memory traffic: reads and writes T*(Hq+Hkv)*D elements, reads T*D cache floats.
Grid: one program per token, covering all its query and key heads.
"""

from __future__ import annotations

import torch

from ._triton import (
    FLOAT_DTYPES,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    next_power_of_2,
    triton_kernel,
)


def rotary_reference(query, key, positions, cos_sin_cache):
    """The spec: returns rotated (query, key)."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions].float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def rotate(x):
        x1, x2 = x.float()[..., :half], x.float()[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(query), rotate(key)


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    positions_ptr,
    cache_ptr,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_cache,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    # One program per token: all its query heads as one [BLOCK_HQ, HALF] tile pair, then all key heads.
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    d_valid = offs < HALF
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cache + offs, mask=d_valid, other=0.0)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + offs, mask=d_valid, other=0.0)[None, :]

    hq = tl.arange(0, BLOCK_HQ)
    mask = (hq < NUM_Q_HEADS)[:, None] & d_valid[None, :]
    src = q_ptr + token * stride_q_token + hq[:, None] * stride_q_head + offs[None, :]
    dst = q_out_ptr + (token * NUM_Q_HEADS + hq[:, None]) * (2 * HALF) + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0)
    a = x1.to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (a * cos - b * sin).to(x1.dtype), mask=mask)
    tl.store(dst + HALF, (b * cos + a * sin).to(x1.dtype), mask=mask)

    hk = tl.arange(0, BLOCK_HK)
    mask = (hk < NUM_K_HEADS)[:, None] & d_valid[None, :]
    src = k_ptr + token * stride_k_token + hk[:, None] * stride_k_head + offs[None, :]
    dst = k_out_ptr + (token * NUM_K_HEADS + hk[:, None]) * (2 * HALF) + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0)
    a = x1.to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (a * cos - b * sin).to(x1.dtype), mask=mask)
    tl.store(dst + HALF, (b * cos + a * sin).to(x1.dtype), mask=mask)


def rotary(query, key, positions, cos_sin_cache):
    """Triton launcher; same contract as `rotary_reference`."""
    if query.dim() != 3 or key.dim() != 3 or query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2]:
        raise ValueError(
            f"expected query [T, Hq, D] and key [T, Hkv, D], got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    num_tokens, num_q_heads, head_dim = query.shape
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_pos, {head_dim}] with an even head_dim, got {tuple(cos_sin_cache.shape)}"
        )
    if positions.shape != (num_tokens,) or positions.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"positions must be [{num_tokens}] int64, got {tuple(positions.shape)} {positions.dtype}")
    check_dtype("query", query, FLOAT_DTYPES)
    if key.dtype != query.dtype:
        raise TypeError(f"key dtype {key.dtype} differs from query dtype {query.dtype}")
    check_dtype("cos_sin_cache", cos_sin_cache, (torch.float32,))
    check_last_dim_contiguous("query", query)
    check_last_dim_contiguous("key", key)
    check_same_device(query=query, key=key, positions=positions, cos_sin_cache=cos_sin_cache)
    cos_sin_cache = cos_sin_cache.contiguous()
    positions = positions.contiguous()
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if num_tokens == 0:
        return q_out, k_out
    num_k_heads = key.shape[1]
    half = head_dim // 2
    _rotary_kernel.on(query.device)[(num_tokens,)](
        query,
        key,
        q_out,
        k_out,
        positions,
        cos_sin_cache,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_K_HEADS=num_k_heads,
        HALF=half,
        BLOCK_HQ=next_power_of_2(num_q_heads),
        BLOCK_HK=next_power_of_2(num_k_heads),
        BLOCK_HALF=next_power_of_2(half),
        num_warps=4 if num_q_heads * half >= 1024 else 1,
    )
    return q_out, k_out
