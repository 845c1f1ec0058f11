"""Sparse Mixture-of-Experts MLP (Mixtral, Qwen3-MoE): a router linear scores the experts, each token goes to its
top-k with softmax weights (renormalised over the k where the family does), and the experts' SwiGLU MLPs run as one
grouped computation over the tokens sorted by expert (ops.fused_experts, kernels/fused_moe.py).

The experts' weights are stacked, as transformers holds them: gate_up_proj [E, 2I, H] (rows [0, I) gate, [I, 2I) up)
and down_proj [E, H, I]. Checkpoints store one tensor per expert and projection; `checkpoint_slot` says where each
goes."""

from __future__ import annotations

import re

import torch
from torch import nn

from inferfleet_runtime.kernels import KernelOps, native
from inferfleet_runtime.kernels.fused_moe import fused_experts_dense, grouped_by_expert
from inferfleet_runtime.model_config import ModelConfig


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E]: the softmax over all E experts in
    float32, its k largest, divided by their sum when renormalize (Mixtral always; Qwen3-MoE with norm_topk_prob)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class StackedExperts(nn.Module):
    """The experts' weights of one layer, stacked along a leading expert dimension."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, gate_up={tuple(self.gate_up_proj.shape[1:])}"


class NativePackedExperts(nn.Module):
    """StackedExperts for the native backend: each expert's gate/up and down weights repacked once into native.c's
    matmul panels (as NativeLinear does for a linear), run by the CPU path's loop over the experts that got tokens
    with native.c's matmul and SiLU-and-mul (at 8 rows of a 256 x 1024 weight, about half of torch's matmul time)."""

    def __init__(self, experts: StackedExperts):
        super().__init__()
        self.num_experts, self.intermediate_size = experts.num_experts, experts.intermediate_size
        self.hidden_size = experts.down_proj.shape[1]
        pack = lambda weights: torch.stack([native.pack_linear(w.detach().contiguous()) for w in weights])  # noqa: E731
        self.register_buffer("gate_up", pack(experts.gate_up_proj))  # [E, packed [2I, H]]
        self.register_buffer("down", pack(experts.down_proj))  # [E, packed [H, I]]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        def expert_mlp(expert: int, rows: torch.Tensor) -> torch.Tensor:
            h = native.silu_and_mul(native.linear(rows, self.gate_up[expert], None, 2 * self.intermediate_size))
            return native.linear(h, self.down[expert], None, self.hidden_size)

        return grouped_by_expert(x if x.stride(-1) == 1 else x.contiguous(), weights, ids, self.num_experts, expert_mlp)


class SparseMoE(nn.Module):
    """x [T, H] -> sum over the token's top-k experts e of weight_e * down_e(silu(gate_e x) * up_e x): [T, H]."""

    def __init__(self, config: ModelConfig, ops: KernelOps):
        super().__init__()
        self.ops = ops
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)  # the router
        self.experts = StackedExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def pack_for_native(self) -> None:
        """Swaps in the experts' native.c panels (the model's enable_native_forward calls this)."""
        self.experts = NativePackedExperts(self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)  # [T, k] each
        if isinstance(self.experts, NativePackedExperts):
            return self.experts(x, weights, ids)
        if torch.compiler.is_exporting() or torch.compiler.is_compiling():  # the compiled engine's trace
            return fused_experts_dense(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids)
        return self.ops.fused_experts(x, self.experts.gate_up_proj, self.experts.down_proj, weights, ids)


# One expert's projection in a checkpoint: Mixtral's block_sparse_moe.experts.N.w1|w2|w3 (gate, down, up) and
# Qwen3-MoE's mlp.experts.N.gate_proj|up_proj|down_proj.
_EXPERT_TENSOR = re.compile(
    r"^(?P<layer>.*)\.(?:mlp|block_sparse_moe)\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
_EXPERT_PROJECTIONS = {  # -> (stacked parameter, row half of gate_up_proj or None)
    "w1": ("gate_up_proj", 0),
    "w3": ("gate_up_proj", 1),
    "w2": ("down_proj", None),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", None),
}


def checkpoint_slot(name: str) -> tuple[str, int | None] | None:
    """Where a checkpoint tensor of a sparse MoE layer goes: (the model's parameter name, part or None for the
    whole parameter), or None for a tensor of no MoE layer. Part numbers a stacked parameter's pieces: 2e + half
    of gate_up_proj (gate 0, up 1), e of down_proj. Mixtral's block_sparse_moe is the model's mlp, and the router
    (gate) and already-stacked experts keep their names."""
    match = _EXPERT_TENSOR.match(name)
    if match is None:
        if ".block_sparse_moe." not in name:
            return None
        return name.replace(".block_sparse_moe.", ".mlp."), None
    stacked, half = _EXPERT_PROJECTIONS[match["proj"]]
    expert = int(match["expert"])
    return f"{match['layer']}.mlp.experts.{stacked}", expert if half is None else 2 * expert + half


def num_parts(name: str, config: ModelConfig) -> int | None:
    """How many per-expert tensors fill a stacked parameter, or None for a parameter that is not one."""
    if name.endswith(".experts.gate_up_proj"):
        return 2 * config.num_experts
    if name.endswith(".experts.down_proj"):
        return config.num_experts
    return None


def missing_pieces(name: str, loaded: set[int], parts: int) -> str:
    """For a stacked expert parameter that the checkpoint filled only partly, which pieces are missing, as
    " (expert 2 up, ...)"; "" for any other parameter."""
    if not loaded or not name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
        return ""
    down = name.endswith(".experts.down_proj")
    pieces = [
        f"expert {p}" if down else f"expert {p // 2} {('gate', 'up')[p % 2]}" for p in range(parts) if p not in loaded
    ]
    return f" ({', '.join(pieces[:4])}{', ...' if len(pieces) > 4 else ''})"


def part_of(param: torch.Tensor, name: str, part: int) -> torch.Tensor:
    """The piece of a stacked parameter that per-expert tensor `part` (checkpoint_slot's numbering) fills."""
    if name.endswith(".experts.down_proj"):
        return param[part]
    expert, half = divmod(part, 2)
    rows = param.shape[1] // 2
    return param[expert].narrow(0, half * rows, rows)
