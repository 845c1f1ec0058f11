"""Reads a GGUF checkpoint (llama.cpp's one-file format) as what the loader needs: an HF-style config, a tokenizer
and Hugging Face-named weights, dequantized to the serving dtype.

Layout facts this module relies on (GGUF spec, llama.cpp's converter):
- metadata keys `general.architecture` = "llama" and `llama.*` give the shape; `tokenizer.ggml.*` the vocabulary;
- a tensor of GGUF shape [ne0, ne1] holds ne1 rows of ne0 values, i.e. an HF [out, in] matrix is [in, out] there;
- q/k projection rows are permuted per head for llama.cpp's adjacent-pair RoPE: the inverse of
  `bench.gguf_export.rope_rows_interleaved` brings them back to HF's half-split pairs;
- a file without `output.weight` ties the LM head to the token embedding.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads on first use: `serve` checks its --model with find_gguf before uvicorn starts
    import torch

    from .config import ModelConfig

logger = logging.getLogger(__name__)


class GGUFError(ValueError):
    """A GGUF file is unreadable, or describes a model or tokenizer this runtime cannot load."""


SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TOKENIZER_MODELS = ("gpt2",)  # byte-level BPE
# Pre-tokenizer names (`tokenizer.ggml.pre`) whose split is GPT-2's byte-level regex, as transformers builds it.
BYTE_LEVEL_PRE_TOKENIZERS = ("default", "gpt2", "smollm")
PASS_THROUGH_TYPES = ("F32", "F16")
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


def find_gguf(path: str | Path) -> Path | None:
    """The GGUF file that `path` names: itself if it is a .gguf file, or the one .gguf in a directory without a
    config.json; None when `path` is something else (a Hugging Face checkpoint directory)."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise GGUFError(f"{path} holds {len(found)} .gguf files ({', '.join(p.name for p in found)}); name one")
    return found[0] if found else None


def load_gguf(
    path: str | Path, dtype: str | torch.dtype | None = None
) -> tuple[ModelConfig, Tokenizer, Iterator[tuple[str, torch.Tensor]]]:
    """(config, tokenizer, weights) for a GGUF file; the config is named after the file's stem and its dtype is
    `dtype` (float32 when unset, whatever the file stores); the weights are read lazily."""
    from .models import read_config

    checkpoint = GGUFCheckpoint(path)
    config = read_config(checkpoint.hf_config(), name=checkpoint.path.stem, dtype=dtype)
    tokenizer = checkpoint.tokenizer(extra_eos_token_ids=config.eos_token_ids)
    return config, tokenizer, checkpoint.weights(config)


class GGUFCheckpoint:
    """One opened GGUF file: its metadata as plain values, and its tensors on demand."""

    def __init__(self, path: str | Path):
        try:
            import gguf
        except ImportError:
            raise GGUFError("reading a GGUF file needs the gguf package (pip install gguf)") from None
        self.path = Path(path)
        with open(self.path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise GGUFError(f"{self.path} is not a GGUF file (it does not start with the GGUF magic)")
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except Exception as exc:  # the reader raises ValueError, IndexError, ... on a cut or damaged file
            raise GGUFError(f"{self.path} is not a readable GGUF file (truncated or damaged?): {exc}") from exc
        self.metadata = {name: field_value(field) for name, field in self._reader.fields.items()}
        self.architecture = self.metadata.get("general.architecture")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise GGUFError(
                f"{self.path.name}: GGUF architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

    def _get(self, key: str, default=None):
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        if value is None:
            raise GGUFError(f"{self.path.name} lacks the metadata key {self.architecture}.{key}")
        return value

    def hf_config(self) -> dict:
        """The Hugging Face config.json this file's metadata stands for."""
        hidden_size, num_heads = int(self._get("embedding_length")), int(self._get("attention.head_count"))
        head_dim = int(self._get("attention.key_length", hidden_size // num_heads))
        rope_dim = int(self._get("rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise GGUFError(f"{self.path.name}: partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
        tensor_names = {t.name for t in self._reader.tensors}
        if "rope_freqs.weight" in tensor_names:
            raise GGUFError(f"{self.path.name}: per-frequency RoPE factors (rope_freqs) are not supported")
        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        hf = {
            "model_type": "llama",
            "vocab_size": int(self.metadata.get(f"{self.architecture}.vocab_size") or len(tokens)),
            "hidden_size": hidden_size,
            "intermediate_size": int(self._get("feed_forward_length")),
            "num_hidden_layers": int(self._get("block_count")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(self._get("attention.head_count_kv", num_heads)),
            "head_dim": head_dim,
            "max_position_embeddings": int(self._get("context_length", 2048)),
            "rms_norm_eps": float(self._get("attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(self._get("rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in tensor_names,
            "bos_token_id": self.metadata.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.metadata.get("tokenizer.ggml.eos_token_id"),
        }
        scaling = self.metadata.get(f"{self.architecture}.rope.scaling.type")
        if scaling == "linear":
            hf["rope_scaling"] = {"rope_type": "linear", "factor": float(self._get("rope.scaling.factor"))}
        elif scaling not in (None, "none"):
            raise GGUFError(f"{self.path.name}: RoPE scaling {scaling!r} is not supported (supported: linear)")
        return hf

    def tokenizer(self, extra_eos_token_ids: list[int] = ()) -> Tokenizer:
        """The byte-level BPE tokenizer the file describes, with its special tokens and chat template."""
        meta = self.metadata
        model = meta.get("tokenizer.ggml.model")
        if model not in SUPPORTED_TOKENIZER_MODELS:
            raise GGUFError(
                f"{self.path.name}: tokenizer model {model!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_TOKENIZER_MODELS)}, i.e. byte-level BPE)"
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in BYTE_LEVEL_PRE_TOKENIZERS:
            raise GGUFError(
                f"{self.path.name}: pre-tokenizer {pre!r} is not supported "
                f"(supported: {', '.join(BYTE_LEVEL_PRE_TOKENIZERS)})"
            )
        tokens = meta["tokenizer.ggml.tokens"]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        backend = byte_level_bpe(tokens, types, meta.get("tokenizer.ggml.merges") or [])
        special = {
            name: tokens[meta[key]] if meta.get(key) is not None else None
            for name, key in (
                ("bos_token", "tokenizer.ggml.bos_token_id"),
                ("eos_token", "tokenizer.ggml.eos_token_id"),
                ("unk_token", "tokenizer.ggml.unknown_token_id"),
                ("pad_token", "tokenizer.ggml.padding_token_id"),
            )
        }
        bos = special["bos_token"]
        if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
            backend.post_processor = processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 $B:1",
                special_tokens=[(bos, meta["tokenizer.ggml.bos_token_id"])],
            )
        return Tokenizer(backend, special, meta.get("tokenizer.chat_template"), extra_eos_token_ids)

    def weights(self, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor in config.dtype) for every tensor, q/k rows back in HF's RoPE order."""
        import torch
        from gguf.quants import dequantize

        names = _hf_names(config.num_layers)
        dequantized: Counter[str] = Counter()
        for tensor in self._reader.tensors:
            if tensor.name not in names:
                raise GGUFError(f"{self.path.name}: tensor {tensor.name!r} has no place in a Llama")
            qtype = tensor.tensor_type.name
            shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest-varying dim first
            if qtype in PASS_THROUGH_TYPES:
                array = np.asarray(tensor.data)
            else:
                array = dequantize(tensor.data, tensor.tensor_type)
                if qtype != "BF16":
                    dequantized[qtype] += 1
            array = array.reshape(shape)
            hf_name = names[tensor.name]
            if hf_name.endswith("q_proj.weight"):
                array = rope_rows_half_split(array, config.num_heads)
            elif hf_name.endswith("k_proj.weight"):
                array = rope_rows_half_split(array, config.num_kv_heads)
            yield hf_name, torch.tensor(array, dtype=config.dtype)
        if dequantized:
            kinds = ", ".join(f"{count} {qtype}" for qtype, count in sorted(dequantized.items()))
            logger.info("Dequantized %s tensors of %s to %s", kinds, self.path.name, str(config.dtype).split(".")[-1])


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


def field_value(field):
    """A metadata field as a Python value: str, int, float, bool, or a list of those."""
    import gguf

    def scalar(kind, part):
        if kind == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        return part.tolist()[0]

    kinds = field.types
    if not kinds:
        return None
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        return [scalar(kinds[-1], field.parts[i]) for i in field.data]
    return scalar(kinds[0], field.parts[field.data[0]])
