"""Reads compressed-tensors checkpoints (config.json's quantization_config, quant_method "compressed-tensors"): with
int weights their linears become QuantizedLinear layers and their tensors QuantizedLinear's layout; FP8 weights
(`float-quantized`, float8_e4m3fn times a per-tensor or per-channel scale) stay FP8 in QuantizedLinear layers (one
scale per row) where the Triton kernels serve the model (`keep_float8`), and are dequantized to the serving dtype
elsewhere (the CPU's native and reference backends have no FP8 matmul).

Formats read: `pack-quantized` (int4 values + 8, eight to an int32 along the input columns, element i in bits
4i..4i+3; `weight_zero_point`, when asymmetric, packed the same way along the output rows) and `int-quantized` /
`naive-quantized` (int8 `weight`). `weight_scale` is [out, G] (group) or [out, 1] (channel); W = (q - zp) * scale.
"""

from __future__ import annotations

import json
import logging
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from inferfleet_runtime.checkpoints.errors import CheckpointError
from inferfleet_runtime.layers.quantized import QuantizedLinear

INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
FLOAT_FORMAT = "float-quantized"
log = logging.getLogger(__name__)

_PARTS = ("weight_packed", "weight", "weight_scale", "weight_zero_point", "weight_shape")


class CompressedCheckpointError(CheckpointError):
    """A compressed-tensors checkpoint this runtime cannot read (one line naming what)."""


@dataclass(frozen=True)
class IntScheme:
    format: str
    num_bits: int
    group_size: int | None  # None: one scale per output channel
    symmetric: bool
    ignore: tuple[str, ...]  # module names left float (e.g. lm_head)
    is_float: bool = False  # FP8 weights: kept (Triton) or dequantized at load (the linears stay nn.Linear)


def scheme_of_dir(model_dir: Path) -> IntScheme | None:
    """The int scheme of a checkpoint directory's config.json, None when it has no quantization_config."""
    quantization = json.loads((model_dir / "config.json").read_text()).get("quantization_config")
    return read_scheme(quantization) if quantization else None


def read_scheme(quantization: dict) -> IntScheme:
    """The weight scheme of a compressed-tensors quantization_config; CompressedCheckpointError naming the field for
    a scheme not read or a malformed one (wrong types, missing keys)."""
    quantization = _object(quantization, "quantization_config")
    fmt, method = quantization.get("format"), quantization.get("quant_method")
    groups = _object(quantization.get("config_groups", {}), "quantization_config.config_groups")
    formats = (*INT_FORMATS, FLOAT_FORMAT)
    if method != "compressed-tensors" or fmt not in formats or len(groups) != 1:
        raise CompressedCheckpointError(
            f"quantization_config {reprlib.repr(method)} format {reprlib.repr(fmt)} with {len(groups)} config "
            f"group(s) is not read (read: compressed-tensors {', '.join(formats)} with one config group)"
        )
    [(group_name, group)] = groups.items()
    where = f"quantization_config.config_groups.{group_name}"
    group = _object(group, where)
    if group.get("input_activations"):
        raise CompressedCheckpointError("compressed-tensors activation quantization is not read (weights only)")
    weights = _object(group.get("weights"), f"{where}.weights")
    kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if bits is not None and type(bits) is not int:  # 8.0 == 8, but a float is no bit count
        raise _malformed(f"{where}.weights.num_bits", bits, "an integer")
    ignore = quantization.get("ignore") or []
    if not isinstance(ignore, list) or not all(type(name) is str for name in ignore):
        raise _malformed("quantization_config.ignore", ignore, "a list of module names")
    if fmt == FLOAT_FORMAT:
        if kind != "float" or bits != 8 or strategy not in ("tensor", "channel"):
            raise CompressedCheckpointError(
                f"compressed-tensors {fmt} weights of type {reprlib.repr(kind)}, {reprlib.repr(bits)} bits, strategy "
                f"{reprlib.repr(strategy)} are not read (read: float, 8 bits, tensor or channel)"
            )
        return IntScheme(fmt, 8, None, True, tuple(ignore), is_float=True)
    wanted_bits = 4 if fmt == "pack-quantized" else 8
    if kind != "int" or bits != wanted_bits or strategy not in ("channel", "group"):
        raise CompressedCheckpointError(
            f"compressed-tensors {fmt} weights of type {reprlib.repr(kind)}, {reprlib.repr(bits)} bits, strategy "
            f"{reprlib.repr(strategy)} are not read (read: int, {wanted_bits} bits, channel or group)"
        )
    group_size = weights.get("group_size") if strategy == "group" else None
    if strategy == "group" and (type(group_size) is not int or group_size < 1):
        raise _malformed(f"{where}.weights.group_size", group_size, "a positive integer (strategy group)")
    symmetric = weights.get("symmetric", True)
    if type(symmetric) is not bool:
        raise _malformed(f"{where}.weights.symmetric", symmetric, "true or false")
    return IntScheme(fmt, bits, group_size, symmetric, tuple(ignore))


def _object(value, field: str) -> dict:
    if value is None:
        raise CompressedCheckpointError(f"{field} is missing")
    if not isinstance(value, dict):
        raise _malformed(field, value, "a JSON object")
    return value


def _malformed(field: str, value, wanted: str) -> CompressedCheckpointError:
    return CompressedCheckpointError(f"{field} is {reprlib.repr(value)}, not {wanted}")


def replace_linears(model: nn.Module, scheme: IntScheme, dtype: torch.dtype, keep_float8: bool = False) -> int:
    """Swaps every nn.Linear not in scheme.ignore for an empty QuantizedLinear (call on the meta device, before
    the weights are loaded). Fused projections (qkv, gate_up) take their parts' rows. FP8 checkpoints keep
    nn.Linear unless keep_float8 (their weights are then dequantized as they are read)."""
    if scheme.is_float and not keep_float8:
        return 0
    targets = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name not in scheme.ignore and f"model.{name}" not in scheme.ignore
    ]
    for name, linear in targets:
        group_size = scheme.group_size or linear.in_features
        quantized = QuantizedLinear(
            linear.in_features, linear.out_features, scheme.num_bits, group_size, linear.bias is not None,
            not scheme.symmetric, dtype, linear.weight.device, fp8=scheme.is_float,
        )  # fmt: skip
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, quantized)
    return len(targets)


def convert_weights(
    weights: Iterator[tuple[str, torch.Tensor]], scheme: IntScheme, keep_float8: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each quantized module's parts turned into `<module>.qweight`, `.scales` and
    `.zeros` (QuantizedLinear's layout; FP8 ones into a float `.weight` unless keep_float8); other tensors pass
    through."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = {"weight_packed" if scheme.format == "pack-quantized" else "weight", "weight_scale"}
    if scheme.format == "pack-quantized":
        needed.add("weight_shape")
    if not scheme.symmetric:
        needed.add("weight_zero_point")
    if scheme.is_float and keep_float8:
        log.info("Kept the checkpoint's FP8 weights in FP8 (the Triton kernel decodes them as it multiplies)")
    elif scheme.is_float:
        log.info(
            "Dequantized the checkpoint's FP8 weights to the serving dtype at load (no FP8 matmul on this backend)"
        )
    for name, tensor in weights:
        module, _, leaf = name.rpartition(".")
        is_stored_float = leaf == "weight" and tensor.is_floating_point() and tensor.dtype != torch.float8_e4m3fn
        if leaf not in _PARTS or is_stored_float:
            yield name, tensor
            continue
        parts = pending.setdefault(module, {})
        parts[leaf] = tensor
        if needed <= parts.keys():
            yield from _converted(module, pending.pop(module), scheme, keep_float8)
    if pending:
        module, parts = next(iter(pending.items()))
        raise CompressedCheckpointError(f"{module} lacks {', '.join(sorted(needed - parts.keys()))}")


def _converted(
    module: str, parts: dict[str, torch.Tensor], scheme: IntScheme, keep_float8: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    if scheme.is_float:  # scale: [1] per tensor or [out, 1] per channel
        weight, scale = parts["weight"], parts["weight_scale"].float()
        if weight.dtype != torch.float8_e4m3fn:
            raise CompressedCheckpointError(f"{module}.weight is {weight.dtype}, not the float8_e4m3fn FP8 weights")
        if keep_float8:  # one scale per row, so a fused projection's parts keep theirs
            yield f"{module}.qweight", weight
            yield f"{module}.scales", scale.reshape(-1, 1).expand(weight.shape[0], 1)
        else:
            yield f"{module}.weight", weight.float() * scale
        return
    if scheme.format == "pack-quantized":
        out_features, in_features = (int(n) for n in parts["weight_shape"])
        u = unpack_int32_nibbles(parts["weight_packed"], in_features)  # [out, in] in [0, 15]
        yield f"{module}.qweight", (u[:, 0::2] | (u[:, 1::2] << 4)).to(torch.uint8)
        if not scheme.symmetric:
            zp = parts["weight_zero_point"]  # [ceil(out / 8), G]: packed along the rows
            zeros = unpack_int32_nibbles(zp.T.contiguous(), out_features).T.to(torch.int16) - 8  # [out, G]
            yield f"{module}.zeros", zeros.to(torch.int8)
    else:
        yield f"{module}.qweight", parts["weight"]
        if not scheme.symmetric:
            yield f"{module}.zeros", parts["weight_zero_point"].to(torch.int8)
    yield f"{module}.scales", parts["weight_scale"]


def unpack_int32_nibbles(packed: torch.Tensor, num_cols: int) -> torch.Tensor:
    """int32 [rows, ceil(cols / 8)] -> uint8 [rows, cols]: value i of a word in bits 4i..4i+3."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [rows, words, 8]
    return nibbles.reshape(packed.shape[0], -1)[:, :num_cols].to(torch.uint8)
