"""A random-weight Llama checkpoint in Hugging Face format (config.json, model.safetensors, tokenizer.json) for
benchmarks that need a model of a given shape rather than a trained one."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from inferfleet_runtime.demo import text as demo_text


@dataclass(frozen=True)
class Shape:
    vocab_size: int = 4096
    hidden_size: int = 512
    intermediate_size: int = 1376
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 4
    max_position_embeddings: int = 1024

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        return 2 * self.vocab_size * h + self.num_layers * (attn + 3 * h * i + 2 * h) + h


def hf_config(shape: Shape) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "dtype": "float32",
    }


def random_weights(shape: Shape, seed: int) -> dict[str, torch.Tensor]:
    """Hugging Face Llama parameter names -> float32 tensors (normal, std 0.02; norms 1)."""
    generator = torch.Generator().manual_seed(seed)
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator) * 0.02

    weights = {
        "model.embed_tokens.weight": normal(shape.vocab_size, h),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": normal(shape.vocab_size, h),
    }
    for n in range(shape.num_layers):
        p = f"model.layers.{n}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(shape.num_heads * d, h),
            p + "self_attn.k_proj.weight": normal(shape.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": normal(shape.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": normal(h, shape.num_heads * d),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    return weights


def corpus() -> str:
    """Enough English text that ships with Python to train a few thousand BPE merges (pydoc's topic help)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        topics = {}
    return demo_text.zen_text() + "\n".join(topics[k] for k in sorted(topics))


def write_random_llama(out_dir: str | Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    """Writes the checkpoint to out_dir (created) and returns it. The tokenizer is a byte-level BPE with exactly
    shape.vocab_size tokens, so every id the model can emit decodes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = demo_text.train_tokenizer(corpus(), vocab_size=shape.vocab_size)
    if tokenizer.get_vocab_size() != shape.vocab_size:
        raise ValueError(
            f"the corpus gave a tokenizer of {tokenizer.get_vocab_size()} tokens, not "
            f"{shape.vocab_size}: choose a smaller vocab_size"
        )
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(demo_text.tokenizer_config(shape.max_position_embeddings)))
    config = hf_config(shape)
    config["bos_token_id"] = tokenizer.token_to_id(demo_text.BOS)
    config["eos_token_id"] = tokenizer.token_to_id(demo_text.END)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(random_weights(shape, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "random_model.json").write_text(json.dumps({"shape": asdict(shape), "seed": seed}))
    return out
