"""Tensor parallelism of the decoder (Megatron-style): each of `world` ranks holds a slice of every large weight and
the ranks meet twice per layer in an all-reduce.

- Attention: rank r holds query heads [r * Hq/w, (r+1) * Hq/w) and the KV heads they read: its own Hkv/w heads when
  Hkv is a multiple of w, else (w a multiple of Hkv) the one KV head its query heads share, replicated on the w/Hkv
  ranks that use it. q/k/v projections are split by output rows (column-parallel), o_proj by input columns
  (row-parallel, its partial outputs summed by an all-reduce).
- Gated MLP: gate and up split by rows, down by columns, then an all-reduce. Any other MLP (a mixture of experts) is
  replicated: every rank computes all of it, so its output needs no reduction.
- Embedding and LM head: vocab-parallel. The vocabulary is padded to a multiple of w; rank r holds rows
  [r * Vp/w, (r+1) * Vp/w). An embedding lookup zeroes the ids another rank holds and all-reduces; the head's
  partial logits are all-gathered along the vocabulary and cut back to V.

The model is built with `local_config`'s shapes and `shard_weights` cuts each checkpoint tensor to this rank's part
as it is read, so no rank holds the whole model. `parallelize` then wraps the layers that talk to the other ranks.
Row-parallel biases are kept on rank 0 only (zero elsewhere), so the all-reduce adds each once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from inferfleet_runtime.model_config import ConfigError, ModelConfig

from .mlp import GatedMLP


@dataclass(frozen=True)
class TensorParallel:
    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a tensor-parallel group of {self.world}")


def padded_vocab(vocab_size: int, world: int) -> int:
    return -(-vocab_size // world) * world


def check_shardable(config: ModelConfig, world: int) -> None:
    """ConfigError naming the first of config's sizes that `world` ranks cannot split."""
    if config.num_heads % world:
        raise ConfigError(
            f"tensor parallelism over {world} ranks needs the attention heads ({config.num_heads}) to divide evenly"
        )
    kv = config.num_kv_heads
    if kv % world and world % kv:
        raise ConfigError(
            f"tensor parallelism over {world} ranks needs the KV heads ({kv}) to be a multiple or a divisor of {world}"
        )
    if config.intermediate_size % world:
        raise ConfigError(
            f"tensor parallelism over {world} ranks needs the MLP width ({config.intermediate_size}) to divide evenly"
        )


def local_config(config: ModelConfig, world: int) -> ModelConfig:
    """The shapes one rank's model is built with: its share of heads, KV heads, MLP width and (padded) vocabulary."""
    check_shardable(config, world)
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // world,
        num_kv_heads=max(1, config.num_kv_heads // world),
        intermediate_size=config.intermediate_size // world,
        vocab_size=padded_vocab(config.vocab_size, world) // world,
    )


def kv_heads_of_rank(config: ModelConfig, tp: TensorParallel) -> tuple[int, int]:
    """(first, count) of the full model's KV heads rank tp.rank holds."""
    if config.num_kv_heads >= tp.world:
        count = config.num_kv_heads // tp.world
        return tp.rank * count, count
    group = config.num_heads // config.num_kv_heads  # query heads per KV head
    first_query_head = tp.rank * (config.num_heads // tp.world)
    return first_query_head // group, 1


_MLP_PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj")


def shard_weights(
    weights: Iterator[tuple[str, torch.Tensor]], config: ModelConfig, tp: TensorParallel
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's (name, tensor) pairs cut to rank tp.rank's part (names unchanged). config is the full model's.

    Tensors it does not know (norms, a router, experts) pass whole: they are replicated."""
    d, w = config.head_dim, tp.world
    q_rows = (tp.rank * config.num_heads // w * d, config.num_heads // w * d)
    kv_first, kv_count = kv_heads_of_rank(config, tp)
    kv_rows = (kv_first * d, kv_count * d)
    inter = config.intermediate_size
    mlp_rows = (tp.rank * inter // w, inter // w)
    vocab_part = padded_vocab(config.vocab_size, w) // w

    def rows(tensor: torch.Tensor, start_length: tuple[int, int]) -> torch.Tensor:
        return tensor.narrow(0, *start_length)

    def columns(tensor: torch.Tensor, start_length: tuple[int, int]) -> torch.Tensor:
        return tensor.narrow(1, *start_length)

    q_size, kv_size = config.num_heads * d, config.num_kv_heads * d
    for name, tensor in weights:
        module, _, leaf = name.rpartition(".")
        parent, _, proj = module.rpartition(".")
        if proj in _MLP_PROJECTIONS and not parent.endswith(".mlp"):
            proj = ""  # an expert's projection (experts.N.gate_proj): replicated with its mixture of experts
        if proj == "q_proj":
            tensor = rows(tensor, q_rows)
        elif proj in ("k_proj", "v_proj"):
            tensor = rows(tensor, kv_rows)
        elif proj == "qkv_proj":  # stored fused (Phi-3): q, k, v row ranges, each cut
            q, k, v = tensor.split([q_size, kv_size, kv_size])
            tensor = torch.cat([rows(q, q_rows), rows(k, kv_rows), rows(v, kv_rows)])
        elif proj in ("gate_proj", "up_proj"):
            tensor = rows(tensor, mlp_rows)
        elif proj == "gate_up_proj":  # stored fused (Phi-3)
            gate, up = tensor.split([inter, inter])
            tensor = torch.cat([rows(gate, mlp_rows), rows(up, mlp_rows)])
        elif proj in ("o_proj", "down_proj"):
            if leaf == "weight":
                tensor = columns(tensor, q_rows if proj == "o_proj" else mlp_rows)
            elif tp.rank != 0:  # bias: added once, by rank 0, before the all-reduce
                tensor = torch.zeros_like(tensor)
        elif name.removeprefix("model.") in ("embed_tokens.weight", "lm_head.weight"):
            part = tensor.new_zeros((vocab_part, *tensor.shape[1:]))
            start = tp.rank * vocab_part
            held = max(0, min(vocab_part, config.vocab_size - start))
            part[:held] = tensor[start : start + held]
            tensor = part
        yield name, tensor.contiguous()


# Wall seconds this process spent in the collectives (waiting for the slowest rank included): bench.tensor_parallel
# reports it as the communication share of a step.
collective_seconds = 0.0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    global collective_seconds
    started = time.perf_counter()
    dist.all_reduce(x)
    collective_seconds += time.perf_counter() - started
    return x


class RowParallel(nn.Module):
    """A row-parallel linear: this rank's columns of the weight times its slice of the input, summed over ranks."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.linear(x))


class ReducedMLP(nn.Module):
    """A gated MLP whose gate/up rows and down columns are this rank's: its output summed over ranks."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(self.mlp(x))


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + part) of the (padded) embedding table; ids outside them look up zeros here."""

    def __init__(self, embedding: nn.Embedding, tp: TensorParallel):
        super().__init__()
        self.embedding = embedding
        self.start = tp.rank * embedding.num_embeddings
        self.part = embedding.num_embeddings

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.part)
        h = self.embedding(local.masked_fill(outside, 0))  # [T, hidden]
        return all_reduce(h.masked_fill(outside.unsqueeze(-1), 0))


class VocabParallelHead(nn.Module):
    """This rank's rows of the LM head; the partial logits of every rank gathered into [N, vocab]."""

    def __init__(self, head: nn.Module, vocab_size: int, world: int):
        super().__init__()
        self.head, self.vocab_size, self.world = head, vocab_size, world

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        part = self.head(hidden).contiguous()  # [N, Vp / w]
        parts = [torch.empty_like(part) for _ in range(self.world)]
        global collective_seconds
        started = time.perf_counter()
        dist.all_gather(parts, part)
        collective_seconds += time.perf_counter() - started
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]  # [N, vocab]


def parallelize(model: nn.Module, tp: TensorParallel, vocab_size: int) -> list[str]:
    """Wraps the loaded (already sharded) model's layers that meet the other ranks; returns what stays replicated."""
    replicated: list[str] = []
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj)
        if isinstance(layer.mlp, GatedMLP):
            layer.mlp = ReducedMLP(layer.mlp)
        elif type(layer.mlp).__name__ not in replicated:
            replicated.append(type(layer.mlp).__name__)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, tp)
    model.lm_head = VocabParallelHead(model.lm_head, vocab_size, tp.world)
    model.native_forward_blockers = ["all-reduce between layers (tensor parallelism)"]
    return replicated
