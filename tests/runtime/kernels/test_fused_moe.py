"""The fused-experts op: the torch CPU path against the formula token by token, the Triton grouped GEMM
(interpreter) against the torch path, and the per-expert block layout the kernel reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferfleet_runtime.kernels import fused_moe
from inferfleet_runtime.layers.moe import route

# (tokens, experts, top_k, hidden, intermediate): a lone decode token (the CPU path takes its experts directly),
# decode-sized (16-row blocks, most experts empty) and prefill-sized
# (64-row blocks), widths that are not multiples of the 64-column and 32-deep tiles.
SHAPES = [(1, 4, 2, 64, 32), (1, 8, 3, 32, 16), (7, 8, 2, 48, 40), (45, 4, 3, 64, 96)]


def experts_inputs(num_tokens, num_experts, top_k, hidden, intermediate, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    w_gate_up = (torch.randn(num_experts, 2 * intermediate, hidden, generator=gen) * 0.2).to(dtype)
    w_down = (torch.randn(num_experts, hidden, intermediate, generator=gen) * 0.2).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights, ids = route(logits, top_k, renormalize=True)
    return x, w_gate_up, w_down, weights, ids


def per_token(x, w_gate_up, w_down, weights, ids):
    """The op's formula, one token and one routed expert at a time."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w_gate_up[e].double() @ x[t].double()).chunk(2)
            out[t] += weights[t, j].double() * (w_down[e].double() @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_torch_path_computes_the_formula(shape):
    args = experts_inputs(*shape, torch.float32)
    got = fused_moe.fused_experts_reference(*args)
    torch.testing.assert_close(got.double(), per_token(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_kernel_matches_torch_path(shape, dtype, tolerance):
    args = experts_inputs(*shape, dtype, seed=1)
    expected = fused_moe.fused_experts_reference(*args)
    got = fused_moe.fused_experts(*args)
    assert got.dtype == dtype and got.shape == expected.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, **tolerance(dtype))
    else:
        # The torch path rounds gate and up to fp16 before SiLU-and-mul, the kernel keeps them in its float32
        # accumulators: against the exact formula the kernel must be at least as close as the torch path.
        exact = per_token(*args)
        kernel_error = (got.double() - exact).abs().max()
        torch_error = (expected.double() - exact).abs().max()
        assert kernel_error <= torch_error * 1.05, (kernel_error, torch_error)
        torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)


def test_triton_kernel_skips_experts_without_tokens_and_handles_an_expert_taking_every_token(tolerance):
    x, w_gate_up, w_down, _, _ = experts_inputs(20, 6, 2, 32, 16, torch.float32, seed=2)
    ids = torch.tensor([[5, 2]] * 20)  # experts 0, 1, 3 and 4 get nothing; 2 and 5 get every token
    weights = torch.full((20, 2), 0.5)
    got = fused_moe.fused_experts(x, w_gate_up, w_down, weights, ids)
    torch.testing.assert_close(got, fused_moe.fused_experts_reference(x, w_gate_up, w_down, weights, ids))
    torch.testing.assert_close(got.double(), per_token(x, w_gate_up, w_down, weights, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_tokens, top_k, block_m", [(1, 2, 16), (9, 3, 4), (50, 2, 16)])
def test_blocks_hold_each_assignment_once_under_its_expert(num_tokens, top_k, block_m):
    num_experts = 5
    ids = torch.randint(0, num_experts, (num_tokens, top_k), generator=torch.Generator().manual_seed(num_tokens))
    sorted_ids, block_expert = fused_moe.align_to_blocks(ids, num_experts, block_m)
    num_assignments = num_tokens * top_k
    assert sorted_ids.numel() == block_expert.numel() * block_m
    real = sorted_ids[sorted_ids < num_assignments]
    assert sorted(real.tolist()) == list(range(num_assignments))  # each (token, expert) pair once
    flat = ids.reshape(-1)
    for block, expert in enumerate(block_expert.tolist()):
        rows = sorted_ids[block * block_m : (block + 1) * block_m]
        rows = rows[rows < num_assignments]
        if expert < 0:
            assert rows.numel() == 0  # blocks past the last expert's carry nothing
        else:
            assert rows.numel() > 0 and bool((flat[rows.long()] == expert).all())
    # the used blocks come first, each expert's in one run, in expert order
    used = [e for e in block_expert.tolist() if e >= 0]
    assert used == sorted(used) and block_expert.tolist()[len(used) :] == [-1] * (len(block_expert) - len(used))


def test_bad_layouts_are_refused():
    x, w_gate_up, w_down, weights, ids = experts_inputs(3, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="expert shapes disagree"):
        fused_moe.fused_experts_reference(x[:, :16], w_gate_up, w_down, weights, ids)
    with pytest.raises(ValueError, match="topk_weights and topk_ids"):
        fused_moe.fused_experts(x, w_gate_up, w_down, weights[:2], ids[:2])
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        fused_moe.fused_experts(x, w_gate_up.transpose(1, 2).contiguous().transpose(1, 2), w_down, weights, ids)
