"""Reads a GGUF checkpoint (llama.cpp's one-file format) as what the loader needs: an HF-style config, a tokenizer
and Hugging Face-named weights: the decoder's Q8_0, Q4_0 and Q4_1 matrices kept quantized (QuantizedLinear's
layout, groups of 32) when the loader asks, everything else dequantized to the serving dtype.

Layout facts this module relies on (GGUF spec, llama.cpp's converter):
- metadata keys `general.architecture` = "llama" and `llama.*` give the shape; `tokenizer.ggml.*` the vocabulary;
- a tensor of GGUF shape [ne0, ne1] holds ne1 rows of ne0 values, i.e. an HF [out, in] matrix is [in, out] there;
- q/k projection rows are permuted per head for llama.cpp's adjacent-pair RoPE: the inverse of
  `bench.gguf_export.rope_rows_interleaved` brings them back to HF's half-split pairs;
- a file without `output.weight` ties the LM head to the token embedding;
- blocks of 32 weights along a row (ggml-common.h): Q8_0 = f16 scale d + 32 int8 (w = d q); Q4_0 = d + 16 bytes
  of nibbles (w = d (u - 8)); Q4_1 = d, f16 min m + 16 bytes (w = d u + m); byte j holds element j in its low
  nibble and element j + 16 in its high one.
"""

from __future__ import annotations

import logging
import math
import reprlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import numpy as np
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from inferfleet_runtime.checkpoints.gguf_format import GGUFError, read_gguf
from inferfleet_runtime.checkpoints.tokenizer import Tokenizer
from inferfleet_runtime.fetch.content_digest import is_left_out

if TYPE_CHECKING:  # torch loads on first use: `serve` checks its --model with find_gguf before uvicorn starts
    import torch

    from inferfleet_runtime.model_config import ModelConfig

logger = logging.getLogger(__name__)


SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TOKENIZER_MODELS = ("gpt2",)  # byte-level BPE
# Pre-tokenizer names (`tokenizer.ggml.pre`) whose split is GPT-2's byte-level regex, as transformers builds it.
BYTE_LEVEL_PRE_TOKENIZERS = ("default", "gpt2", "smollm")
PASS_THROUGH_TYPES = ("F32", "F16")
# GGUF types kept quantized: type -> (bits, has a per-block min); block of 32 weights with an f16 scale each.
KEPT_TYPES = {"Q8_0": (8, False), "Q4_0": (4, False), "Q4_1": (4, True)}
GGUF_BLOCK = 32
# Projections the runtime fuses into one linear (loader._FUSED): kept quantized only when every part has one type.
FUSED_PARTS = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "ffn_gate": "gate_up", "ffn_up": "gate_up"}
RUNTIME_LINEARS = {
    "qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "gate_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp token types

# GGUF name -> HF name; per-layer names carry "{n}".
TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{n}.attn_norm.weight": "model.layers.{n}.input_layernorm.weight",
    "blk.{n}.attn_q.weight": "model.layers.{n}.self_attn.q_proj.weight",
    "blk.{n}.attn_k.weight": "model.layers.{n}.self_attn.k_proj.weight",
    "blk.{n}.attn_v.weight": "model.layers.{n}.self_attn.v_proj.weight",
    "blk.{n}.attn_output.weight": "model.layers.{n}.self_attn.o_proj.weight",
    "blk.{n}.ffn_norm.weight": "model.layers.{n}.post_attention_layernorm.weight",
    "blk.{n}.ffn_gate.weight": "model.layers.{n}.mlp.gate_proj.weight",
    "blk.{n}.ffn_up.weight": "model.layers.{n}.mlp.up_proj.weight",
    "blk.{n}.ffn_down.weight": "model.layers.{n}.mlp.down_proj.weight",
}
# GGUF name -> its HF shape [out, in] in named sizes (GGUFCheckpoint._check_shapes).
TENSOR_DIMS = {
    "token_embd.weight": ("vocab", "hidden"),
    "output_norm.weight": ("hidden",),
    "output.weight": ("vocab", "hidden"),
    "blk.{n}.attn_norm.weight": ("hidden",),
    "blk.{n}.attn_q.weight": ("q", "hidden"),
    "blk.{n}.attn_k.weight": ("kv", "hidden"),
    "blk.{n}.attn_v.weight": ("kv", "hidden"),
    "blk.{n}.attn_output.weight": ("hidden", "q"),
    "blk.{n}.ffn_norm.weight": ("hidden",),
    "blk.{n}.ffn_gate.weight": ("mlp", "hidden"),
    "blk.{n}.ffn_up.weight": ("mlp", "hidden"),
    "blk.{n}.ffn_down.weight": ("hidden", "mlp"),
}


def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file that `path` names: itself if it is a .gguf file, or the one .gguf in a directory without a
    config.json (hidden ones aside, as the content digest leaves them out; one linking out of the directory is
    refused); None when `path` is something else (a Hugging Face checkpoint directory)."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.glob("*.gguf") if not is_left_out(Path(p.name)))  # as the content digest counts
    if len(found) > 1:
        raise GGUFError(f"{path} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}); name one")
    if found and not found[0].resolve().is_relative_to(path.resolve()):
        raise GGUFError(f"{path}: {found[0].name} links to {found[0].resolve()}, outside the model folder")
    return found[0] if found else None


class GGUFWeights:
    """The weights of a GGUF file as (HF name, tensor), read lazily; `kept` maps each decoder linear kept quantized
    (its name in the runtime model, e.g. "layers.0.self_attn.qkv_proj") to (bits, has offsets), whose tensors come
    as `<module>.qweight`, `.scales` and (Q4_1) `.offsets` in QuantizedLinear's layout."""

    def __init__(self, checkpoint: GGUFCheckpoint, config: ModelConfig, keep_quantized: bool):
        self.checkpoint, self.config = checkpoint, config
        self.kept = checkpoint.kept_quantized(config.num_layers) if keep_quantized else {}

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.checkpoint.weights(self.config, self.kept)


def load_gguf(
    path: str | Path, dtype: str | torch.dtype | None = None, keep_quantized: bool = False
) -> tuple[ModelConfig, Tokenizer, GGUFWeights]:
    """(config, tokenizer, weights) for a GGUF file; the config is named after the file's stem and its dtype is
    `dtype` (float32 when unset, whatever the file stores); the weights are read lazily, with the decoder's Q8_0,
    Q4_0 and Q4_1 linears kept quantized when keep_quantized (GGUFWeights.kept says which)."""
    from inferfleet_runtime.model_config import ConfigError
    from inferfleet_runtime.models import read_config

    checkpoint = GGUFCheckpoint(path)
    try:
        config = read_config(checkpoint.hf_config(), name=checkpoint.path.stem, dtype=dtype)
    except ConfigError as exc:
        raise GGUFError(f"{checkpoint.path.name}: its metadata describes no model this runtime serves: {exc}") from exc
    tokenizer = checkpoint.tokenizer(extra_eos_token_ids=config.eos_token_ids)
    return config, tokenizer, GGUFWeights(checkpoint, config, keep_quantized)


class GGUFCheckpoint:
    """One opened GGUF file: its metadata as plain values, and its tensors on demand. Every value the model and the
    tokenizer are built from is checked (type, range, and the shapes the file's tensors really have) first, so a bad
    file ends in a GGUFError naming the key or tensor."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metadata, self.tensors = read_gguf(self.path)
        self.architecture = self.metadata.get("general.architecture")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(
                f"{self.path.name}: GGUF architecture {reprlib.repr(self.architecture)} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

    def _get(self, key: str, default=None):
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        if value is None:
            raise GGUFError(f"{self.path.name} lacks the metadata key {self.architecture}.{key}")
        return value

    def _refuse(self, key: str, value, wanted: str) -> GGUFError:
        return GGUFError(f"{self.path.name}: metadata {key} is {reprlib.repr(value)}, not {wanted}")

    def _int(self, key: str, default: int | None = None) -> int:
        """The architecture's positive integer `key`."""
        value = self._get(key, default)
        if type(value) is not int or value < 1:
            raise self._refuse(f"{self.architecture}.{key}", value, "a positive integer")
        return value

    def _float(self, key: str, default: float | None = None) -> float:
        """The architecture's positive finite number `key`."""
        value = self._get(key, default)
        if type(value) not in (int, float) or not 0 < value < math.inf:
            raise self._refuse(f"{self.architecture}.{key}", value, "a positive number")
        return float(value)

    def _checked(self, key: str, is_valid, wanted: str, default=None):
        """metadata[key], or default when absent; GGUFError naming the key when is_valid(value) is false."""
        value = self.metadata.get(key, default)
        if not is_valid(value):
            raise self._refuse(key, value, wanted)
        return value

    def _tokens(self) -> list[str]:
        if "tokenizer.ggml.tokens" not in self.metadata:
            raise GGUFError(f"{self.path.name} lacks the metadata key tokenizer.ggml.tokens (its vocabulary)")
        return self._checked(
            "tokenizer.ggml.tokens",
            lambda v: isinstance(v, list) and all(type(t) is str for t in v),
            "a list of strings",
        )

    def _token_id(self, key: str, num_tokens: int) -> int | None:
        return self._checked(
            key, lambda v: v is None or type(v) is int and 0 <= v < num_tokens, f"a token id < {num_tokens}"
        )

    def hf_config(self) -> dict:
        """The Hugging Face config.json this file's metadata stands for."""
        hidden_size, num_heads = self._int("embedding_length"), self._int("attention.head_count")
        if f"{self.architecture}.attention.key_length" not in self.metadata and hidden_size % num_heads:
            raise self._refuse(f"{self.architecture}.attention.head_count", num_heads, f"a divisor of {hidden_size}")
        head_dim = self._int("attention.key_length", hidden_size // num_heads)
        if head_dim % 2:
            raise self._refuse(f"{self.architecture}.attention.key_length", head_dim, "even (RoPE rotates pairs)")
        rope_dim = self._int("rope.dimension_count", head_dim)
        if rope_dim != head_dim:
            raise GGUFError(f"{self.path.name}: partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
        tensor_names = {t.name for t in self.tensors}
        if "rope_freqs.weight" in tensor_names:
            raise GGUFError(f"{self.path.name}: per-frequency RoPE factors (rope_freqs) are not supported")
        tokens = self._tokens()
        hf = {
            "model_type": "llama",
            "vocab_size": self._int("vocab_size", len(tokens) or None),
            "hidden_size": hidden_size,
            "intermediate_size": self._int("feed_forward_length"),
            "num_hidden_layers": self._int("block_count"),
            "num_attention_heads": num_heads,
            "num_key_value_heads": self._int("attention.head_count_kv", num_heads),
            "head_dim": head_dim,
            "max_position_embeddings": self._int("context_length", 2048),
            "rms_norm_eps": self._float("attention.layer_norm_rms_epsilon", 1e-5),
            "rope_theta": self._float("rope.freq_base", 10000.0),
            "tie_word_embeddings": "output.weight" not in tensor_names,
            "bos_token_id": self._token_id("tokenizer.ggml.bos_token_id", len(tokens)),
            "eos_token_id": self._token_id("tokenizer.ggml.eos_token_id", len(tokens)),
        }
        scaling = self.metadata.get(f"{self.architecture}.rope.scaling.type")
        if scaling == "linear":
            hf["rope_scaling"] = {"rope_type": "linear", "factor": self._float("rope.scaling.factor")}
        elif scaling not in (None, "none"):
            raise GGUFError(
                f"{self.path.name}: RoPE scaling {reprlib.repr(scaling)} is not supported (supported: linear)"
            )
        self._check_shapes(hf)
        return hf

    def _check_shapes(self, hf: dict) -> None:
        """Every tensor a Llama of this metadata needs is in the file, with the shape the metadata implies: so every
        size the model is built with is bounded by the file's own size."""
        num_layers = hf["num_hidden_layers"]
        if num_layers > len(self.tensors):
            raise self._refuse(f"{self.architecture}.block_count", num_layers, f"<= its {len(self.tensors)} tensors")
        q, kv = hf["num_attention_heads"] * hf["head_dim"], hf["num_key_value_heads"] * hf["head_dim"]
        sizes = {  # size -> (value, the metadata keys it comes from)
            "vocab": (hf["vocab_size"], "vocab_size (or the token count)"),
            "hidden": (hf["hidden_size"], "embedding_length"),
            "q": (q, "attention.head_count x key_length"),
            "kv": (kv, "attention.head_count_kv x key_length"),
            "mlp": (hf["intermediate_size"], "feed_forward_length"),
        }
        by_name = {t.name: t for t in self.tensors}
        for template, dims in TENSOR_DIMS.items():
            for n in range(num_layers) if "{n}" in template else [None]:
                name = template.format(n=n)
                if name not in by_name:
                    if name == "output.weight":  # tied to the token embedding
                        continue
                    raise GGUFError(f"{self.path.name} lacks tensor {name!r} of its {num_layers}-layer Llama")
                shape = list(reversed(by_name[name].shape))
                expected = [sizes[d][0] for d in dims]
                if shape != expected:
                    keys = ", ".join(f"{self.architecture}.{sizes[d][1]}" for d in dims)
                    raise GGUFError(
                        f"{self.path.name}: tensor {name!r} has shape {shape}, its metadata ({keys}) implies {expected}"
                    )

    def tokenizer(self, extra_eos_token_ids: list[int] = ()) -> Tokenizer:
        """The byte-level BPE tokenizer the file describes, with its special tokens and chat template."""
        meta = self.metadata
        model = meta.get("tokenizer.ggml.model")
        if model not in SUPPORTED_TOKENIZER_MODELS:
            raise GGUFError(
                f"{self.path.name}: tokenizer model {reprlib.repr(model)} is not supported "
                f"(supported: {', '.join(SUPPORTED_TOKENIZER_MODELS)}, i.e. byte-level BPE)"
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in BYTE_LEVEL_PRE_TOKENIZERS:
            raise GGUFError(
                f"{self.path.name}: pre-tokenizer {reprlib.repr(pre)} is not supported "
                f"(supported: {', '.join(BYTE_LEVEL_PRE_TOKENIZERS)})"
            )
        tokens = self._tokens()
        types = self._checked(
            "tokenizer.ggml.token_type",
            lambda v: isinstance(v, list) and len(v) == len(tokens) and all(type(t) is int for t in v),
            f"a list of {len(tokens)} integers (one per token)",
            [1] * len(tokens),
        )
        merges = self._checked(
            "tokenizer.ggml.merges",
            lambda v: isinstance(v, list) and all(type(m) is str and " " in m for m in v),
            "a list of merges (two tokens and a space)",
            [],
        )
        ids = {
            name: self._token_id(key, len(tokens))
            for name, key in (
                ("bos_token", "tokenizer.ggml.bos_token_id"),
                ("eos_token", "tokenizer.ggml.eos_token_id"),
                ("unk_token", "tokenizer.ggml.unknown_token_id"),
                ("pad_token", "tokenizer.ggml.padding_token_id"),
            )
        }
        special = {name: None if i is None else tokens[i] for name, i in ids.items()}
        add_bos = self._checked("tokenizer.ggml.add_bos_token", lambda v: type(v) is bool, "true or false", False)
        template = self._checked("tokenizer.chat_template", lambda v: v is None or type(v) is str, "a string")
        try:
            backend = byte_level_bpe(tokens, types, merges)
            bos = special["bos_token"]
            if add_bos and bos is not None:
                backend.post_processor = processors.TemplateProcessing(
                    single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1", special_tokens=[(bos, ids["bos_token"])]
                )
        except Exception as exc:  # tokenizers raises bare Exceptions (a merge of tokens outside the vocabulary)
            raise GGUFError(
                f"{self.path.name}: metadata tokenizer.ggml.merges and special tokens do not fit the vocabulary: {exc}"
            ) from exc
        try:
            return Tokenizer(backend, special, template, extra_eos_token_ids)
        except jinja2.TemplateError as exc:
            raise GGUFError(f"{self.path.name}: metadata tokenizer.chat_template is no Jinja template: {exc}") from exc

    def kept_quantized(self, num_layers: int) -> dict[str, tuple[int, bool]]:
        """The runtime linears whose GGUF tensors (every part, for a fused one) share one type of KEPT_TYPES:
        module name -> (bits, has offsets)."""
        types: dict[str, set[str]] = {}
        for tensor in self.tensors:
            parts = tensor.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight" or not parts[1].isdigit():
                continue
            linear = FUSED_PARTS.get(parts[2], parts[2])
            if linear in RUNTIME_LINEARS:
                types.setdefault(f"layers.{parts[1]}.{RUNTIME_LINEARS[linear]}", set()).add(tensor.tensor_type.name)
        kept = {
            module: KEPT_TYPES[next(iter(kinds))]
            for module, kinds in types.items()
            if len(kinds) == 1 and next(iter(kinds)) in KEPT_TYPES
        }
        # The LM head from the file's own blocks (output.weight, or the tied token embedding, which itself is
        # dequantized for the lookups), so logits are those of the file's weights.
        head = self._head_tensor()
        if kept and head is not None and head.tensor_type.name in KEPT_TYPES:
            kept["lm_head"] = KEPT_TYPES[head.tensor_type.name]
        return kept

    def _head_tensor(self):
        by_name = {t.name: t for t in self.tensors}
        return by_name.get("output.weight", by_name.get("token_embd.weight"))

    def weights(
        self, config: ModelConfig, kept: dict[str, tuple[int, bool]] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor in config.dtype) for every tensor, q/k rows back in HF's RoPE order; the tensors of the
        linears in `kept` (kept_quantized) as `<HF module>.qweight`, `.scales` and `.offsets` instead."""
        import torch
        from gguf.quants import dequantize

        from inferfleet_runtime.layers.quantized import pack_int4

        names = _hf_names(config.num_layers)
        head = self._head_tensor() if kept and "lm_head" in kept else None
        dequantized: Counter[str] = Counter()
        for tensor in self.tensors:
            if tensor.name not in names:
                raise GGUFError(f"{self.path.name}: tensor {tensor.name!r} has no place in a Llama")
            qtype = tensor.tensor_type.name
            shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest-varying dim first
            hf_name = names[tensor.name]
            module = "lm_head" if head is not None and tensor.name == head.name else None
            if kept and module is None and _runtime_module(hf_name) in kept:
                module = hf_name.removesuffix(".weight")
            if module is not None:
                q, scales, offsets = split_blocks(np.asarray(tensor.data), qtype, shape)
                heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}.get(hf_name.split(".")[-2])
                if heads:
                    q, scales = rope_rows_half_split(q, heads), rope_rows_half_split(scales, heads)
                    offsets = None if offsets is None else rope_rows_half_split(offsets, heads)
                q = torch.from_numpy(np.ascontiguousarray(q))
                yield f"{module}.qweight", pack_int4(q) if KEPT_TYPES[qtype][0] == 4 else q
                yield f"{module}.scales", torch.tensor(scales, dtype=config.dtype)
                if offsets is not None:
                    yield f"{module}.offsets", torch.tensor(offsets, dtype=config.dtype)
                if tensor.name != "token_embd.weight":  # the tied embedding is also needed in float
                    continue
            if qtype in PASS_THROUGH_TYPES:
                array = np.asarray(tensor.data)
            else:
                try:
                    array = dequantize(tensor.data, tensor.tensor_type)
                except NotImplementedError:
                    raise GGUFError(
                        f"{self.path.name}: tensor {tensor.name!r} of type {qtype} cannot be decoded"
                    ) from None
                if qtype != "BF16":
                    dequantized[qtype] += 1
            array = array.reshape(shape)
            if hf_name.endswith("q_proj.weight"):
                array = rope_rows_half_split(array, config.num_heads)
            elif hf_name.endswith("k_proj.weight"):
                array = rope_rows_half_split(array, config.num_kv_heads)
            yield hf_name, torch.tensor(array, dtype=config.dtype)
        if dequantized:
            kinds = ", ".join(f"{count} {qtype}" for qtype, count in sorted(dequantized.items()))
            logger.info("Dequantized %s tensors of %s to %s", kinds, self.path.name, str(config.dtype).split(".")[-1])
        if kept:
            logger.info(
                "Kept %d linears of %s quantized (Q8_0 / Q4_0 / Q4_1 as int8 / int4)", len(kept), self.path.name
            )


def split_blocks(
    raw: np.ndarray, qtype: str, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A Q8_0 / Q4_0 / Q4_1 matrix's bytes [rows, bytes per row] -> (q int8 [rows, cols] in [-128, 127] or
    [-8, 7], scales float32 [rows, cols / 32], offsets float32 [rows, cols / 32] or None) with
    w = q * scale + offset, element for element what the block formats (module docstring) decode to."""
    rows, cols = shape
    if cols % GGUF_BLOCK:
        raise GGUFError(f"a {qtype} matrix needs a multiple of {GGUF_BLOCK} columns, got {cols}")
    blocks = raw.reshape(rows, cols // GGUF_BLOCK, -1)  # [rows, G, bytes per block]
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, G]
    if qtype == "Q8_0":
        q = blocks[..., 2:].copy().view(np.int8)
        return q.reshape(rows, cols), d, None
    nibbles = blocks[..., 4:] if qtype == "Q4_1" else blocks[..., 2:]  # [rows, G, 16]
    u = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)  # element j, then j + 16
    q = (u.astype(np.int8) - 8).reshape(rows, cols)
    if qtype == "Q4_0":
        return q, d, None
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return q, d, m + 8 * d  # d u + m = d (u - 8) + (m + 8 d)


_FUSED_HF = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}  # fmt: skip


def _runtime_module(hf_name: str) -> str:
    """The runtime linear an HF weight name lands in: model.layers.0.self_attn.q_proj.weight ->
    layers.0.self_attn.qkv_proj."""
    prefix, _, proj = hf_name.removeprefix("model.").removesuffix(".weight").rpartition(".")
    return f"{prefix}.{_FUSED_HF.get(proj, proj)}"


def replace_gguf_linears(model, kept: dict[str, tuple[int, bool]], dtype) -> int:
    """Swaps each linear in `kept` (GGUFWeights.kept) for an empty QuantizedLinear of its GGUF layout (groups of
    32, offsets for Q4_1); call on the meta device, before the weights are loaded. Returns how many."""
    from inferfleet_runtime.layers.quantized import QuantizedLinear

    for name, (bits, has_offsets) in kept.items():
        linear = model.get_submodule(name)
        quantized = QuantizedLinear(
            linear.in_features, linear.out_features, bits, GGUF_BLOCK, linear.bias is not None,
            dtype=dtype, device=linear.weight.device, has_offsets=has_offsets,
        )  # fmt: skip
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, quantized)
    return len(kept)


def rope_rows_half_split(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorders q/k projection rows from llama.cpp's adjacent RoPE pairs (2i, 2i + 1) back to HF's half-split pairs
    (i, i + D/2), per head: the inverse of bench.gguf_export.rope_rows_interleaved. weight: [num_heads * D, hidden]."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def byte_level_bpe(tokens: list[str], types: list[int], merges: list[str]) -> HFTokenizer:
    """A byte-level BPE tokenizer over the file's vocabulary: GPT-2's regex split and byte alphabet (what
    transformers builds for such a GGUF), control tokens as special added tokens, user-defined ones as plain
    added tokens (both matched whole)."""
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    spelling = _byte_spelling()
    # A vocabulary token written outside the byte alphabet (e.g. with real spaces) is respelled byte by byte.
    spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {token: i for i, token in enumerate(spelled)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    backend = HFTokenizer(
        models.BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="")
    )
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a mislabel in the file; adding it would grow the vocab.
    backend.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, kind in zip(tokens, types)
            if kind == TOKEN_CONTROL and set(t) <= alphabet
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, types)
            if kind == TOKEN_USER_DEFINED and t in vocab
        ]
    )
    return backend


def _byte_spelling() -> dict[int, str]:
    """byte -> the character GPT-2's byte-level alphabet writes it as (printable bytes as themselves, the rest
    shifted past U+0100 in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in spelling)
    spelling.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return spelling


def _hf_names(num_layers: int) -> dict[str, str]:
    names = {}
    for gguf_name, hf_name in TENSOR_NAMES.items():
        for n in range(num_layers) if "{n}" in gguf_name else [None]:
            names[gguf_name.format(n=n)] = hf_name.format(n=n)
    return names
