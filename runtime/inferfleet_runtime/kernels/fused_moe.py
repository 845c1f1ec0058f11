"""Fused experts: the SwiGLU experts of a sparse Mixture-of-Experts layer run as one grouped computation.

Math: each token t is routed to k experts e = topk_ids[t, j] with weights w = topk_weights[t, j]; for expert e with
gate/up weights G_e = W_gate_up[e] ([2I, H], rows [0, I) gate, [I, 2I) up) and down weights D_e = W_down[e] ([H, I]),
    out[t] = sum_j w[t, j] * D_e (silu(G_e[:I] x_t) * G_e[I:] x_t),   e = topk_ids[t, j],
in float32 accumulators, the result in x's dtype.
Layouts: x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I] (last dims contiguous), topk_weights [T, k] float32,
topk_ids [T, k] int64; out [T, H] contiguous.

Two implementations of that contract:
- `fused_experts_reference`, the spec and the CPU path (reference and native backends): the T * k (token, expert)
  assignments sorted by expert, each expert's rows gathered and run as two matmuls, the weighted results added
  back per token. The loop is over the experts that received tokens (at most E), never over tokens.
- `fused_experts`, the Triton kernel: the sorted assignments padded per expert to whole BLOCK_M blocks
  (`align_to_blocks`), then one grouped GEMM launch over (row block, column block) for gate/up with SiLU-and-mul
  fused (two accumulators), and one for down with the routing weight applied; the k results of a token are summed
  last. Grid: (padded rows / BLOCK_M, ceil(columns / BLOCK_N)); blocks past the last expert's exit at once.
Memory traffic: each expert's weights are read once per row block routed to it; x rows are gathered, not copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton import FLOAT_DTYPES, check_dtype, check_last_dim_contiguous, check_same_device, triton_kernel
from .activation import silu_and_mul_reference


def check_experts_args(x, w_gate_up, w_down, topk_weights, topk_ids) -> None:
    """ValueError/TypeError unless the arguments have the layouts in the module docstring."""
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(
            f"expected x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]; got {tuple(x.shape)}, "
            f"{tuple(w_gate_up.shape)}, {tuple(w_down.shape)}"
        )
    num_experts, two_i, hidden = w_gate_up.shape
    if x.shape[1] != hidden or tuple(w_down.shape) != (num_experts, hidden, two_i // 2) or two_i % 2:
        raise ValueError(
            f"expert shapes disagree: x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)}, "
            f"w_down {tuple(w_down.shape)}"
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"expected topk_weights and topk_ids [T, k] for T={x.shape[0]}; got {tuple(topk_weights.shape)}, "
            f"{tuple(topk_ids.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids has dtype {topk_ids.dtype}; expected an integer index dtype")


def fused_experts_reference(x, w_gate_up, w_down, topk_weights, topk_ids):
    """The spec, and the CPU path: a loop over the experts that got tokens, each running its rows as a matmul."""
    check_experts_args(x, w_gate_up, w_down, topk_weights, topk_ids)

    def expert_mlp(expert: int, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(silu_and_mul_reference(F.linear(rows, w_gate_up[expert])), w_down[expert])

    return grouped_by_expert(x, topk_weights, topk_ids, w_gate_up.shape[0], expert_mlp)


def fused_experts_dense(x, w_gate_up, w_down, topk_weights, topk_ids):
    """The same contract computed by every expert for every token, each result weighted by the token's routing
    weight for that expert (zero where it is not routed): E / k times the experts' matmul work, but no shape depends
    on the routing, so torch.export can trace it (what the compiled engine exports)."""
    check_experts_args(x, w_gate_up, w_down, topk_weights, topk_ids)
    num_experts, num_tokens = w_gate_up.shape[0], x.shape[0]
    combine = torch.zeros(num_tokens, num_experts, dtype=torch.float32, device=x.device)
    combine = combine.scatter(1, topk_ids.long(), topk_weights.float())  # [T, E]
    h = torch.bmm(x.expand(num_experts, -1, -1), w_gate_up.transpose(1, 2))  # [E, T, 2I]
    h = silu_and_mul_reference(h.reshape(num_experts * num_tokens, -1)).view(num_experts, num_tokens, -1)
    y = torch.bmm(h, w_down.transpose(1, 2))  # [E, T, H]
    return (y.float() * combine.t()[..., None]).sum(dim=0).to(x.dtype)


def grouped_by_expert(x, topk_weights, topk_ids, num_experts: int, expert_mlp) -> torch.Tensor:
    """sum_j topk_weights[t, j] * expert_mlp(topk_ids[t, j], rows) per token t, with expert_mlp(e, x rows [n, H])
    -> [n, H] called once per expert that got tokens, on its rows gathered (the CPU paths' shared loop)."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return out.to(x.dtype)
    if num_tokens == 1:  # a lone decode token: its k experts directly, in expert order as below (no sort, no gather)
        weights = topk_weights[0].float()
        for j in sorted(range(top_k), key=lambda j: int(topk_ids[0, j])):
            out += expert_mlp(int(topk_ids[0, j]), x).float() * weights[j]
        return out.to(x.dtype)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # assignment indices (t * k + j) grouped by expert
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    sorted_tokens = order // top_k
    sorted_weights = topk_weights.reshape(-1).float()[order, None]  # [T * k, 1]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        tokens = sorted_tokens[start : start + count]
        y = expert_mlp(expert, x.index_select(0, tokens))  # [n, H]
        out.index_add_(0, tokens, y.float() * sorted_weights[start : start + count])
        start += count
    return out.to(x.dtype)


def align_to_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids int32 [P], block_expert int32 [P / block_m]) for the grouped GEMM, computed on the device.

    sorted_ids lists the assignments (t * k + j) grouped by expert, each expert's group padded with the
    out-of-range id T * k to whole blocks of block_m; block_expert[b] is the expert of block b, or -1 for the blocks
    past the last group. P bounds the padded length without reading the counts back: at most ceil(T * k / block_m)
    full blocks plus one partial block per expert that got tokens (at most min(E, T * k))."""
    flat_ids = topk_ids.reshape(-1).to(torch.int64)
    num_assignments = flat_ids.numel()
    counts = torch.bincount(flat_ids, minlength=num_experts)  # [E]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    count_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat_ids, stable=True)
    expert_of = flat_ids[order]
    rank = torch.arange(num_assignments, device=flat_ids.device) - count_start[expert_of]
    num_blocks = -(-num_assignments // block_m) + min(num_experts, num_assignments)
    sorted_ids = torch.full((num_blocks * block_m,), num_assignments, dtype=torch.int32, device=flat_ids.device)
    sorted_ids[padded_start[expert_of] + rank] = order.to(torch.int32)
    block_starts = torch.arange(num_blocks, device=flat_ids.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


tl = None  # triton.language, bound at first launch (see _triton.TritonKernel)


@triton_kernel
def _fused_moe_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_assignments,
    N,
    K,
    stride_a,
    stride_we,
    stride_wn,
    stride_out,
    A_ROWS_PER_TOKEN: tl.constexpr,  # a's row of assignment i is i // A_ROWS_PER_TOKEN (top_k over x, 1 after)
    GATED: tl.constexpr,  # out = silu(a W[:N]^T) * (a W[N:2N]^T), else out = a W^T
    MUL_WEIGHT: tl.constexpr,  # out rows scaled by their routing weight
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_ids_ptr + rows)  # [BLOCK_M] assignments; num_assignments marks padding
    row_ok = ids < num_assignments
    a_rows = (ids // A_ROWS_PER_TOKEN).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_base = w_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_a + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        w = tl.load(w_base + cols[None, :].to(tl.int64) * stride_wn + ks[:, None], mask=w_mask, other=0.0)  # [K, N]
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
        if GATED:
            up_rows = (cols[None, :] + N).to(tl.int64)
            w_up = tl.load(w_base + up_rows * stride_wn + ks[:, None], mask=w_mask, other=0.0)
            acc_up += tl.dot(a, w_up, input_precision=DOT_PRECISION)
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        weight = tl.load(topk_weights_ptr + ids, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * weight[:, None]
    out_offs = ids.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def block_sizes(num_assignments: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): 16-row blocks for decode-sized batches, where most experts get a row or two,
    64 once there are enough rows per expert to fill them."""
    return (16 if num_assignments <= 64 else 64), 64, 32


def _launch(a, w, out, topk_weights, sorted_ids, block_expert, num_assignments, n, rows_per_token, gated, blocks):
    block_m, block_n, block_k = blocks
    grid = (block_expert.shape[0], -(-n // block_n))
    _fused_moe_kernel.on(a.device)[grid](
        a, w, out, topk_weights, sorted_ids, block_expert,
        num_assignments, n, a.shape[1], a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        A_ROWS_PER_TOKEN=rows_per_token, GATED=gated, MUL_WEIGHT=not gated,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
    )  # fmt: skip


def fused_experts(x, w_gate_up, w_down, topk_weights, topk_ids):
    """Triton launcher; same contract as `fused_experts_reference`."""
    check_experts_args(x, w_gate_up, w_down, topk_weights, topk_ids)
    for name, t in (("x", x), ("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_dtype(name, t, FLOAT_DTYPES)
        check_last_dim_contiguous(name, t)
    check_same_device(x=x, w_gate_up=w_gate_up, w_down=w_down, topk_weights=topk_weights, topk_ids=topk_ids)
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, hidden = w_gate_up.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    num_assignments = num_tokens * top_k
    blocks = block_sizes(num_assignments)
    sorted_ids, block_expert = align_to_blocks(topk_ids, num_experts, blocks[0])
    weights = topk_weights.reshape(-1).contiguous().float()
    intermediate = torch.empty((num_assignments, two_i // 2), dtype=x.dtype, device=x.device)
    _launch(x, w_gate_up, intermediate, weights, sorted_ids, block_expert, num_assignments, two_i // 2, top_k, True,
            blocks)  # fmt: skip
    down = torch.empty((num_assignments, hidden), dtype=torch.float32, device=x.device)
    _launch(intermediate, w_down, down, weights, sorted_ids, block_expert, num_assignments, hidden, 1, False, blocks)
    return down.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
