"""Weight-only quantized matmul: y = x W^T (+ bias) with W held as layers.quantized.QuantizedLinear holds it.

Math: W[n, k] = (q[n, k] - z[n, g]) * s[n, g] + o[n, g], g = k // group_size (z and o 0 where absent), y in
float32 accumulation, cast to x's dtype.
Layouts: x [M, K] (last dim contiguous); qweight int8 [N, K] (8 bits), float8_e4m3fn [N, K] (8 bits: FP8
weights, q is the float the byte encodes) or uint8 [N, K / 2] (4 bits: column 2i in the low nibble, 2i + 1 in the
high one, each holding q + 8); scales [N, G]; zeros int8 [N, G] or None; offsets [N, G] or None; bias [N] or None.
FP8 bytes are decoded to float32 in registers from their bits (sign, 4 exponent bits biased by 7, 3 mantissa bits;
exponent 0 is subnormal, m * 2^-9; 0x7F / 0xFF are NaN), so the kernel needs no FP8 hardware: it builds for sm_80
and gfx942 as for sm_90, and runs in the interpreter.
Memory traffic: the weight once per BLOCK_M rows of x, at 1 or 1/2 byte per element plus its group's scale. Grid:
(ceil(M / BLOCK_M), ceil(N / BLOCK_N)); each program walks K in BLOCK_K steps, widening its [BLOCK_N, BLOCK_K]
weight tile to float in registers (any group size: each column's scale is gathered by its group index).
"""

from __future__ import annotations

import torch

from ._triton import FLOAT_DTYPES, check_dtype, check_last_dim_contiguous, triton_kernel


def quantized_matmul_reference(x, qweight, scales, zeros, offsets, bits, group_size, bias=None):
    """The spec: dequantize W in float32, one matmul."""
    n = qweight.shape[0]
    if bits == 8:
        q = qweight.float()  # int8, or float8_e4m3fn's values
    else:
        q = torch.stack(((qweight & 0x0F).float() - 8, (qweight >> 4).float() - 8), dim=-1).view(n, -1)
    q = q.view(n, -1, group_size)
    if zeros is not None:
        q = q - zeros.float()[..., None]
    w = q * scales.float()[..., None]
    if offsets is not None:
        w = w + offsets.float()[..., None]
    y = x.float() @ w.view(n, -1).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _quantized_matmul_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, o_ptr, b_ptr, out_ptr, M, N, K, G, group_size, stride_x, stride_q, stride_out,
    BITS: tl.constexpr, FP8: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < M, cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :],
                    mask=row_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)  # fmt: skip
        w_mask = col_mask[:, None] & k_mask[None, :]
        w_rows = cols[:, None].to(tl.int64)
        if FP8:  # float8_e4m3fn bytes: normal numbers re-biased into float32's bit fields, subnormals m * 2^-9
            byte = tl.load(q_ptr + w_rows * stride_q + ks[None, :], mask=w_mask, other=0).to(tl.int32)
            exponent, mantissa = (byte >> 3) & 15, byte & 7
            normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
            q = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)
            q = tl.where((byte & 127) == 127, float("nan"), q)
            q = tl.where(byte >= 128, -q, q)
        elif BITS == 8:
            q = tl.load(q_ptr + w_rows * stride_q + ks[None, :], mask=w_mask, other=0).to(tl.float32)
        else:
            byte = tl.load(q_ptr + w_rows * stride_q + ks[None, :] // 2, mask=w_mask, other=8).to(tl.int32)
            q = ((byte >> ((ks[None, :] % 2) * 4)) & 15).to(tl.float32) - 8.0
        group = w_rows * G + ks[None, :] // group_size
        if HAS_ZEROS:
            q = q - tl.load(z_ptr + group, mask=w_mask, other=0).to(tl.float32)
        w = q * tl.load(s_ptr + group, mask=w_mask, other=0.0).to(tl.float32)
        if HAS_OFFSETS:
            w = w + tl.load(o_ptr + group, mask=w_mask, other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def quantized_matmul(x, qweight, scales, zeros, offsets, bits, group_size, bias=None):
    """Triton launcher; same contract as `quantized_matmul_reference`."""
    if x.dim() != 2:
        raise ValueError(f"expected x [M, K], got {tuple(x.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_dim_contiguous("x", x)
    m, k = x.shape
    n = qweight.shape[0]
    fp8 = qweight.dtype == torch.float8_e4m3fn
    if fp8 and bits != 8:
        raise ValueError(f"FP8 weights are 8-bit, not {bits}-bit")
    expected_cols = k if bits == 8 else k // 2
    if bits not in (4, 8) or k % group_size or (bits == 4 and k % 2) or qweight.shape[1] != expected_cols:
        raise ValueError(
            f"a {bits}-bit weight of shape {tuple(qweight.shape)} with group size {group_size} does not take "
            f"x of {k} columns"
        )
    qweight, scales = qweight.contiguous(), scales.contiguous()
    if fp8:
        qweight = qweight.view(torch.uint8)  # the kernel decodes the bytes itself
    zeros = None if zeros is None else zeros.contiguous()
    offsets = None if offsets is None else offsets.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    block_m, block_n, block_k = 16, 32, 32
    grid = ((m + block_m - 1) // block_m, (n + block_n - 1) // block_n)
    _quantized_matmul_kernel.on(x.device)[grid](
        x, qweight, scales, scales if zeros is None else zeros, scales if offsets is None else offsets,
        scales if bias is None else bias, out, m, n, k, k // group_size, group_size, x.stride(0), qweight.stride(0),
        out.stride(0), BITS=bits, FP8=fp8, HAS_ZEROS=zeros is not None, HAS_OFFSETS=offsets is not None,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return out
