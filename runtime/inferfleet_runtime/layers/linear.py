"""Serving forms of nn.Linear for float32 on a CPU (oneDNN-packed or native-packed weights) and the pass that
swaps them in."""

from __future__ import annotations

import logging

import torch
from torch import nn

from inferfleet_runtime.kernels import native

from .quantized import QuantizedLinear

log = logging.getLogger(__name__)

# Rows the packed layout is chosen for: one layout serves small and large batches close to their own best
# (figures: docs/performance/2026-12-07-figures-from-code-comments.md).
PACKED_LINEAR_BATCH_HINT = 32
# Smallest weight packed (elements). Each oneDNN call has a fixed cost over MKL's for a matrix that stays in cache,
# so packing small linears slows a small model down (figures: docs/performance/2026-12-07-figures-from-code-comments.md); the `bench compare` model's smallest
# weight is 512 x 512.
PACKED_LINEAR_MIN_WEIGHT = 512 * 512


class PackedLinear(nn.Module):
    """nn.Linear (x W^T + b over [T, in] rows) for float32 on a CPU, its weight reordered once into oneDNN's
    blocked layout: on the `bench compare` model the step's 33 matmuls took 5.3 ms at batch 1 and 15.1 ms at
    batch 32 this way, against 8.6 and 26.2 ms through nn.Linear (2 threads, quiet machine).

    `torch.ops.mkldnn` is PyTorch's own oneDNN binding (what inductor's CPU backend calls), not a public API:
    `pack_linears` checks that it is there and leaves nn.Linear in place when it is not.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKED_LINEAR_BATCH_HINT)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")  # [T, out]


def can_pack_linears(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class NativeLinear(nn.Module):
    """nn.Linear (x W^T + b over [T, in] rows) for the native kernel backend: its weight repacked once into the
    panels of native.c's matmul, which streams each weight once per call and keeps a block of rows in registers
    (kernels/native.py `linear`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features = linear.out_features
        self.register_buffer("weight", native.pack_linear(linear.weight.detach().contiguous()))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x if x.stride(-1) == 1 else x.contiguous()
        return native.linear(x, self.weight, self.bias, self.out_features)  # [T, out]


class NativeQuantizedLinear(nn.Module):
    """A QuantizedLinear for the native kernel backend: its integers, scales and zero points (or offsets) packed once
    into the panels of native.c's quantized matmul (kernels/native.py `quantized_linear`), for int8 activations
    (integer dot products) or float ones (the weights widened to float in registers) as
    native.default_activations picks; the whole-stack native forward reads the same packed weight."""

    def __init__(self, layer: QuantizedLinear):
        super().__init__()
        self.out_features, self.in_features = layer.out_features, layer.in_features
        scales = layer.scales.detach().float()
        offsets = None
        if layer.zeros is not None:
            offsets = -layer.zeros.float() * scales
        if layer.offsets is not None:
            offsets = layer.offsets.float() if offsets is None else offsets + layer.offsets.float()
        self.packed = native.pack_quantized(layer.int_weight(), scales, offsets, layer.bits, layer.group_size,
                                            native.default_activations(layer.bits, layer.group_size,
                                                                       layer.runtime_quantized))  # fmt: skip
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x if x.stride(-1) == 1 else x.contiguous()
        return native.quantized_linear(x, self.packed, self.bias)  # [T, out]

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, bits={self.packed.bits}, group={self.packed.group_size}, "
            f"activations={self.packed.activations}"
        )


def pack_linears(model: nn.Module, min_weight: int = PACKED_LINEAR_MIN_WEIGHT) -> int:
    """Replaces the nn.Linear layers of a float32 CPU model for serving (the packed weights are opaque, so export
    and weight loading use the model before this): every one by a NativeLinear when the model runs the native
    kernels, else each whose weight has at least min_weight elements by a PackedLinear (oneDNN). A native model
    then gets its whole-stack native forward where its family has one (`enable_native_forward`). Returns how
    many linears were replaced; a QuantizedLinear becomes a NativeQuantizedLinear on the native backend and stays
    as it is (torch reference) elsewhere."""
    native_backend = getattr(getattr(model, "ops", None), "backend", None) == "native"
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if (isinstance(module, nn.Linear) and (native_backend or module.weight.numel() >= min_weight))
        or (native_backend and isinstance(module, QuantizedLinear))
    ]
    if not targets:
        return 0
    if native_backend:  # kernels.get_ops gives the native backend only to float32 models on a CPU
        replacement = NativeLinear
    elif can_pack_linears(targets[0][1].weight.device, targets[0][1].weight.dtype):
        replacement = PackedLinear
    else:
        return 0
    for name, module in targets:
        parent_name, _, leaf = name.rpartition(".")
        swapped = NativeQuantizedLinear(module) if isinstance(module, QuantizedLinear) else replacement(module)
        setattr(model.get_submodule(parent_name), leaf, swapped)
    if native_backend and hasattr(model, "enable_native_forward"):
        model.enable_native_forward()
    return len(targets)
