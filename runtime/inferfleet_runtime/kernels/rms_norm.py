"""Fused RMSNorm with an optional residual add.

Math (per row of H values, accumulated in float32):
    with residual:  r = x + residual  (rounded to x.dtype, returned as residual_out)
                    out = r / sqrt(mean(r**2) + eps) * weight
    without:        residual_out = x, out = x / sqrt(mean(x**2) + eps) * weight
The normalised value is computed from the rounded r, as Hugging Face Llama does when it adds the
residual in the activation dtype before normalising.

Layouts: x, residual, out, residual_out [T, H] (last dim contiguous, any row stride); weight [H].
Memory traffic per call: reads T*H (x) [+ T*H residual] + H weight, writes T*H [+ T*H residual_out]
elements; one program per row holds the whole row (H up to a few thousand) in registers.
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


def rms_norm_reference(x, weight, eps, residual=None):
    """The spec: returns (out, residual_out)."""
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    residual_out = x
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return out.to(x.dtype), residual_out


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / hidden_size
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = x32 * (1.0 / tl.sqrt(variance + eps)) * w
    tl.store(out_ptr + row * stride_out + cols, out.to(x.dtype), mask=mask)


def rms_norm(x, weight, eps, residual=None):
    """Triton launcher; same contract as `rms_norm_reference`."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"expected x [T, H] and weight [H], got {tuple(x.shape)} and {tuple(weight.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_dim_contiguous("x", x)
    check_same_device(x=x, weight=weight, **({"residual": residual} if residual is not None else {}))
    weight = weight.contiguous()
    num_tokens, hidden_size = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs {tuple(x.shape)} {x.dtype}"
            )
        check_last_dim_contiguous("residual", residual)
        residual_out = torch.empty_like(out)
    else:
        residual, residual_out = x, x
    if num_tokens == 0:
        return out, residual_out
    kernel = _rms_norm_kernel.on(x.device)
    kernel[(num_tokens,)](
        x,
        residual,
        weight,
        out,
        residual_out,
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        residual_out.stride(0),
        hidden_size,
        float(eps),
        HAS_RESIDUAL=residual_out is not x,
        BLOCK_H=next_power_of_2(hidden_size),
        num_warps=min(8, max(1, next_power_of_2(hidden_size) // 1024)),
    )
    return out, residual_out
