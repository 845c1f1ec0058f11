"""Writes a Hugging Face Llama checkpoint (safetensors + tokenizer.json) as a float32 GGUF file for llama.cpp, with
the `gguf` package, so that `bench compare` can serve the same weights with `llama-server`.

llama.cpp's own converter refuses byte-level BPE tokenizers whose pre-tokenizer it does not know (the built-in and
benchmark models train their own); this writer declares the GPT-2 ("default") pre-tokenizer instead. Prompts in
the comparison are token ids, so the pre-tokenizer never runs; the vocabulary and merges are only used to spell
the generated tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from inferfleet_runtime.checkpoints.loader import read_safetensors
from inferfleet_runtime.models import read_config_dir

# HF name suffix -> GGUF name suffix, per layer.
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5  # llama.cpp token types


def rope_rows_interleaved(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorders q/k projection rows from HF's half-split RoPE pairs (i, i + D/2) to llama.cpp's adjacent pairs
    (2i, 2i + 1), per head. weight: [num_heads * D, hidden]."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def tokenizer_vocab(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges) from tokenizer.json, padded to the model's vocab size."""
    data = json.loads((model_dir / "tokenizer.json").read_text())
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{model_dir}/tokenizer.json is a {model.get('type')} tokenizer; only BPE is written")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    special: set[int] = set()
    for added in data.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    if max(by_id) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(by_id)}, beyond the model's vocab of {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_CONTROL if i in special else TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


# GGUF matrix types write_gguf can store (the gguf package's own quantizers) and the file type each names.
GGUF_MATRIX_TYPES = {"F32": "ALL_F32", "Q8_0": "MOSTLY_Q8_0", "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1"}


def write_gguf(model_dir: str | Path, out_path: str | Path, qtype: str = "F32") -> Path:
    """Writes model_dir as GGUF (architecture llama) to out_path: norms float32, every matrix (embedding and output
    included, as llama-quantize --pure does) float32 or quantized to qtype (Q8_0, Q4_0 or Q4_1)."""
    import gguf

    if qtype not in GGUF_MATRIX_TYPES:
        raise ValueError(f"GGUF matrix type must be one of {', '.join(GGUF_MATRIX_TYPES)}, got {qtype!r}")

    model_dir, out_path = Path(model_dir), Path(out_path)
    config = read_config_dir(model_dir, dtype="float32")
    if config.rope_scaling is not None or config.attention_bias or config.mlp_bias:
        raise ValueError("the GGUF writer handles plain-RoPE Llama checkpoints without biases only")
    state = {name: tensor.float().numpy() for name, tensor in read_safetensors(model_dir)}
    tokens, types, merges = tokenizer_vocab(model_dir, config.vocab_size)

    writer = gguf.GGUFWriter(str(out_path), "llama")
    writer.add_name(model_dir.name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType[GGUF_MATRIX_TYPES[qtype]])

    def add_tensor(name: str, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if qtype == "F32" or array.ndim != 2:
            writer.add_tensor(name, array)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if config.bos_token_id is not None:
        writer.add_bos_token_id(config.bos_token_id)
    if config.eos_token_ids:
        writer.add_eos_token_id(config.eos_token_ids[0])
    writer.add_add_bos_token(False)

    add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for n in range(config.num_layers):
        for hf_suffix, gguf_suffix in LAYER_TENSORS.items():
            weight = state[f"model.layers.{n}.{hf_suffix}"]
            if hf_suffix == "self_attn.q_proj.weight":
                weight = rope_rows_interleaved(weight, config.num_heads)
            elif hf_suffix == "self_attn.k_proj.weight":
                weight = rope_rows_interleaved(weight, config.num_kv_heads)
            add_tensor(f"blk.{n}.{gguf_suffix}", weight)
    add_tensor("output_norm.weight", state["model.norm.weight"])
    lm_head = state.get("lm_head.weight", state["model.embed_tokens.weight"])  # tied embeddings: the same matrix
    add_tensor("output.weight", lm_head)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def write_float_checkpoint(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """The reverse of write_gguf: a GGUF file's weights dequantized to float32 as a Hugging Face Llama checkpoint
    (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) in out_dir, so a quantized file such as
    the real demo model's can be benchmarked as float32 and re-quantized by `serve --quantization`."""
    from safetensors.torch import save_file

    from inferfleet_runtime.checkpoints.gguf import load_gguf

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    _, tokenizer, weights = load_gguf(gguf_path, dtype="float32")
    hf = weights.checkpoint.hf_config() | {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float32"}
    state = {name: tensor.contiguous() for name, tensor in weights}
    if hf["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf, indent=1))
    tokenizer.backend.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {key: value for key, value in tokenizer.special_tokens.items() if value is not None}
    if tokenizer.chat_template:
        tokenizer_config["chat_template"] = tokenizer.chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return out_dir
