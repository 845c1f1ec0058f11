"""KV cache write: scatter each new token's key and value into its cache slot.

Math: for token t with slot s = slot_mapping[t] = block_id * block_size + offset,
    key_cache[block_id, offset] = key[t];  value_cache[block_id, offset] = value[t]   (in place)
Layouts: key, value [T, Hkv, D] (last dim contiguous, token/head strides free);
key_cache, value_cache [num_blocks, block_size, Hkv, D] contiguous; slot_mapping [T] int64.
Slot offsets are computed in int64, so caches past 2**31 elements are addressed correctly.
Memory traffic: reads 2*T*Hkv*D elements and writes as many. Grid: one program per token.
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


def write_kv_reference(key, value, key_cache, value_cache, slot_mapping):
    """The spec: in-place scatter of key/value rows into the caches."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    slots = slot_mapping.long()
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key.to(key_cache.dtype))
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value.to(value_cache.dtype))


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token: its [Hkv, D] key and value rows land in one contiguous cache slot.
    token = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h < NUM_KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + h[:, None] * HEAD_DIM + d[None, :]
    k = tl.load(key_ptr + token * stride_key_token + h[:, None] * stride_key_head + d[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_value_token + h[:, None] * stride_value_head + d[None, :], mask=mask)
    tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(key, value, key_cache, value_cache, slot_mapping):
    """Triton launcher; same contract as `write_kv_reference`."""
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            f"caches must both be [num_blocks, block_size, Hkv, D], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    num_tokens = key.shape[0]
    for name, t in (("key", key), ("value", value)):
        if t.shape != (num_tokens, num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [{num_tokens}, {num_kv_heads}, {head_dim}], got {tuple(t.shape)}")
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_dim_contiguous(name, t)
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"slot_mapping must be [{num_tokens}] int64, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}"
        )
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("key_cache and value_cache must be contiguous")
    check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping)
    if num_tokens == 0:
        return
    _write_kv_kernel.on(key.device)[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping.contiguous(),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
