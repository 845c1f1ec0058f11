"""Loads a Hugging Face Llama-family checkpoint directory into the runtime's model, tokenizer and config."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from inferfleet_runtime.checkpoints.compressed_tensors import convert_weights, replace_linears, scheme_of_dir
from inferfleet_runtime.checkpoints.errors import CheckpointError  # every reader's errors are CheckpointErrors
from inferfleet_runtime.checkpoints.gguf import find_gguf, load_gguf, replace_gguf_linears
from inferfleet_runtime.checkpoints.tokenizer import Tokenizer
from inferfleet_runtime.device import pick_device
from inferfleet_runtime.fetch.content_digest import is_left_out
from inferfleet_runtime.kernels import get_ops
from inferfleet_runtime.layers import moe
from inferfleet_runtime.layers.parallel import TensorParallel, local_config, parallelize, shard_weights
from inferfleet_runtime.layers.quantized import (
    QuantizedLinear,
    empty_quantized_linears,
    quantize_as_read,
    quantize_vocabulary,
    quantized_tensors,
)
from inferfleet_runtime.model_config import ModelConfig
from inferfleet_runtime.models import build_model, read_config_dir

# Checkpoint projection name -> (fused parameter in our model, index of its row range).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module  # the family's decoder (models.FAMILIES)
    config: ModelConfig
    tokenizer: Tokenizer
    device: torch.device


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    kernels: str = "auto",
    quantization: str = "none",
    tensor_parallel: TensorParallel | None = None,
) -> LoadedModel:
    """The model (eval, on device), its config and tokenizer; dtype defaults to the checkpoint's.

    model_dir is a Hugging Face checkpoint directory, a .gguf file or a directory holding one .gguf; quantization
    int8 or int4 quantizes the decoder's linears as their weights are read (layers.quantized). With
    tensor_parallel, the model holds this rank's part of each weight (layers.parallel); config stays the whole
    model's."""
    checkpoint = _read_checkpoint(Path(model_dir), dtype, quantization, tensor_parallel)
    config, weights, scheme = checkpoint.config, checkpoint.weights, checkpoint.scheme
    device = pick_device(device)
    ops = get_ops(kernels, config.dtype, device)
    keep_float8 = ops.quantized_matmul is not None  # FP8 weights stay FP8 where a kernel multiplies them (Triton)
    if scheme is not None:
        weights = convert_weights(weights, scheme, keep_float8)
    model_config = config
    if tensor_parallel is not None and tensor_parallel.world > 1:
        if scheme is not None or quantization != "none":
            raise CheckpointError("tensor parallelism shards float weights only: serve quantized weights on one rank")
        model_config = local_config(config, tensor_parallel.world)
        weights = shard_weights(weights, config, tensor_parallel)
    model, weights = _build_on_meta(model_config, ops, checkpoint, weights, quantization, keep_float8)
    # to_empty without its empty_like of meta tensors, which imports torch's symbolic shapes (sympy) for nothing.
    model = model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    if config.tie_word_embeddings and isinstance(model.lm_head, torch.nn.Linear):  # new storage unties them
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, weights)
    _finish_quantized(model, scheme, quantization)
    model.init_rope()
    if model_config is not config:
        replicated = parallelize(model, tensor_parallel, config.vocab_size)
        if replicated:
            log.info("Replicated %s on every tensor-parallel rank", ", ".join(replicated))
    return LoadedModel(model=model.eval(), config=config, tokenizer=checkpoint.tokenizer, device=device)


@dataclasses.dataclass
class _Checkpoint:
    """What a checkpoint holds, read but not yet placed: config, tokenizer, weights (an iterator of (name, tensor),
    a GGUF file's with `.kept` quantized blocks), the GGUF file if it is one, a compressed-tensors scheme if any."""

    config: Any
    tokenizer: Tokenizer
    weights: Any
    gguf_file: Path | None
    scheme: Any


def _read_checkpoint(model_dir: Path, dtype, quantization: str, tensor_parallel: TensorParallel | None) -> _Checkpoint:
    gguf_file = find_gguf(model_dir)
    scheme = None
    if gguf_file is not None:
        # Kept quantized on one rank; tensor parallelism shards float weights, so its ranks dequantize.
        sharded = tensor_parallel is not None and tensor_parallel.world > 1
        config, tokenizer, weights = load_gguf(gguf_file, dtype, keep_quantized=quantization == "none" and not sharded)
    else:
        config = read_config_dir(model_dir, dtype=dtype)
        tokenizer = Tokenizer.from_dir(model_dir, extra_eos_token_ids=config.eos_token_ids)
        weights = read_safetensors(model_dir)
        scheme = scheme_of_dir(model_dir)  # a compressed-tensors checkpoint's int weights stay quantized
    # Generation stops at any EOS named by config.json, generation_config.json or the tokenizer.
    config = dataclasses.replace(
        config, eos_token_ids=list(dict.fromkeys(config.eos_token_ids + tokenizer.eos_token_ids))
    )
    return _Checkpoint(config, tokenizer, weights, gguf_file, scheme)


def _build_on_meta(model_config, ops, checkpoint: _Checkpoint, weights, quantization: str, keep_float8: bool):
    """The model built on the meta device (no memory), its linears replaced by quantized ones where the checkpoint
    or --quantization says; the weights to load (quantized as they are read for --quantization)."""
    with torch.device("meta"):
        model = build_model(model_config, ops).to(checkpoint.config.dtype)
        if checkpoint.scheme is not None:
            replace_linears(model, checkpoint.scheme, checkpoint.config.dtype, keep_float8)
        elif checkpoint.gguf_file is not None and weights.kept:  # the file's Q8_0 / Q4_0 / Q4_1 linears stay quantized
            replace_gguf_linears(model, weights.kept, checkpoint.config.dtype)
        elif empty_quantized_linears(model, quantization):
            weights = _quantized_as_read(weights, model)
    return model, weights


def _finish_quantized(model, scheme, quantization: str) -> None:
    """The vocabulary quantized (unless a compressed-tensors checkpoint says itself) and every quantized linear given
    the backend's kernel."""
    if scheme is None:  # --quantization or a GGUF file's kept blocks; a compressed-tensors checkpoint says itself
        # A GGUF file's embedding stays as the file has it (dequantized): rounding it again moves real answers.
        quantize_vocabulary(model, with_embedding=quantization != "none")
    for layer in model.modules():  # quantized linears run the backend's kernel where it has one
        if isinstance(layer, QuantizedLinear):
            layer.matmul = model.ops.quantized_matmul


def release_freed_memory() -> None:
    """Hands the memory a load freed (float tensors read, quantized or packed, and dropped) back to the system:
    glibc keeps freed heap for reuse, so a server would stay at the load's peak. Only gc where libc is not glibc."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): no malloc_trim
        pass


def read_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the weight files (safetensors_files)."""
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files: the shards model.safetensors.index.json names, else every *.safetensors file. Only files
    the model's content digest covers (fetch.content_digest): each a file name in model_dir, neither hidden nor a
    `.part` download (such a file beside the weights is no weight file), and no link out of model_dir."""
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text()).get("weight_map")
        except (ValueError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(type(name) is str for name in weight_map.values()):
            raise CheckpointError(f"{index_path} holds no weight_map of tensor names to shard file names")
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(p.name for p in model_dir.glob("*.safetensors") if not is_left_out(Path(p.name)))
    if not names:
        raise CheckpointError(f"{model_dir} has no *.safetensors weights")
    root, files = model_dir.resolve(), []
    for name in names:
        if not name or Path(name).name != name:  # "../x", "/x", "sub/x"
            raise CheckpointError(f"{index_path} names shard {name!r}, which is no file name in the model folder")
        if is_left_out(Path(name)):
            raise CheckpointError(
                f"{index_path} names shard {name!r}, a hidden file or a partial download: not part of the model "
                "(its content digest leaves such files out)"
            )
        path = model_dir / name
        if not path.is_file():
            raise CheckpointError(f"{model_dir} lacks shard {name} named in its index")
        if not path.resolve().is_relative_to(root):
            raise CheckpointError(f"{model_dir}: shard {name} links to {path.resolve()}, outside the model folder")
        files.append(path)
    return files


@torch.no_grad()
def load_weights(model: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Copies Hugging Face-named tensors into the model, filling fused q/k/v and gate/up row ranges (or the whole
    fused parameter, where the checkpoint stores it fused: Phi-3) and each expert's piece of a Mixture-of-Experts
    layer's stacked expert weights (layers.moe.checkpoint_slot)."""
    config = model.config
    params = dict(model.named_parameters()) | quantized_tensors(model)
    expected = {name: _num_parts(name, config) for name in params}
    loaded: dict[str, set[int]] = {}
    for hf_name, tensor in weights:
        name = hf_name.removeprefix("model.")
        if name.endswith(_IGNORED_SUFFIXES) or (config.tie_word_embeddings and name == "lm_head.weight"):
            continue
        part = None
        module, _, leaf = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        moe_slot = moe.checkpoint_slot(name)
        if moe_slot is not None:
            name, part = moe_slot
        elif proj in _FUSED:
            fused, part = _FUSED[proj]
            name = f"{prefix}.{fused}.{leaf}"
        if name not in params or (part is not None and part >= expected[name]):
            raise CheckpointError(
                f"checkpoint tensor {hf_name!r} has no place in a {config.num_layers}-layer {config.family} decoder"
            )
        target = params[name] if part is None else _part_of(config, params[name], name, part)
        if target.shape != tensor.shape:
            raise CheckpointError(
                f"{hf_name}: checkpoint shape {tuple(tensor.shape)}, config implies {tuple(target.shape)}"
            )
        target.copy_(tensor)
        loaded.setdefault(name, set()).update(range(expected[name]) if part is None else [part])
    missing = [name for name, parts in expected.items() if len(loaded.get(name, ())) != parts]
    if missing:
        first = missing[0]
        detail = moe.missing_pieces(first, loaded.get(first, set()), expected[first])
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {first}{detail}")


def _quantized_as_read(
    weights: Iterator[tuple[str, torch.Tensor]], model: torch.nn.Module
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors, each weight of a QuantizedLinear (or of a fused part of one) quantized as it comes."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}  # runs after to_empty
    for hf_name, tensor in weights:
        module, _, leaf = hf_name.removeprefix("model.").rpartition(".")
        prefix, _, proj = module.rpartition(".")
        layer = layers.get(f"{prefix}.{_FUSED[proj][0]}" if proj in _FUSED else module)
        if layer is not None and leaf == "weight":
            qweight, scales = quantize_as_read(layer, tensor)
            yield f"{module}.qweight", qweight
            yield f"{module}.scales", scales
        else:
            yield hf_name, tensor


def _num_parts(name: str, config: ModelConfig) -> int:
    return moe.num_parts(name, config) or (3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 1)


def _part_of(config: ModelConfig, param: torch.Tensor, name: str, part: int) -> torch.Tensor:
    if ".experts." in name:
        return moe.part_of(param, name, part)
    return param.narrow(0, *_row_range(config, name, part))


def _row_range(config: ModelConfig, name: str, part: int) -> tuple[int, int]:
    """(start, length) of one projection's rows inside a fused parameter."""
    if ".qkv_proj." in name:
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        return [(0, q), (q, kv), (q + kv, kv)][part]
    return part * config.intermediate_size, config.intermediate_size
