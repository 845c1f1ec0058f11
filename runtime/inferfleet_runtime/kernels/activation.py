"""SiLU-and-mul, the gated activation of Llama-style MLPs (and GeGLU-tanh, Gemma's, as a torch reference only).

Math: for x [T, 2I], out[t, i] = silu(x[t, i]) * x[t, I + i], silu(a) = a * sigmoid(a), in float32;
GeGLU-tanh puts gelu_tanh(a) = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3))) in place of silu.
Layouts: x [T, 2I] (last dim contiguous), out [T, I] contiguous.
Memory traffic: reads 2*T*I, writes T*I elements. Grid: (T, ceil(I / BLOCK)).
"""

from __future__ import annotations

import torch

from ._triton import FLOAT_DTYPES, check_dtype, check_last_dim_contiguous, next_power_of_2, triton_kernel


def silu_and_mul_reference(x):
    """The spec: silu(x[:, :I]) * x[:, I:]."""
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def gelu_tanh_and_mul_reference(x):
    """gelu_tanh(x[:, :I]) * x[:, I:] (the spec, and the only implementation: every backend runs it)."""
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(x.dtype)


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, intermediate_size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate_size
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + intermediate_size + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x):
    """Triton launcher; same contract as `silu_and_mul_reference`."""
    if x.dim() != 2 or x.shape[1] % 2 != 0:
        raise ValueError(f"expected x [T, 2I], got {tuple(x.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_dim_contiguous("x", x)
    num_tokens, intermediate_size = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, intermediate_size), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block = min(1024, next_power_of_2(intermediate_size))
    grid = (num_tokens, (intermediate_size + block - 1) // block)
    _silu_and_mul_kernel.on(x.device)[grid](x, out, x.stride(0), out.stride(0), intermediate_size, BLOCK=block)
    return out
