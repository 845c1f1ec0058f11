"""Shared fixtures: the built-in demo model and tiny random-weight Hugging Face Llama checkpoints."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# The operator tests' helper modules (planning_data, crd_eval, crd_cases, fake_transport) import by name under
# --import-mode=importlib, from the operator tests and the contract tests alike.
# Triton fixes interpreter mode for its own library (tl.zeros, tl.max, ...) when it is first imported. The root
# conftest is loaded before any test module is collected, so setting the flag here holds whichever folder's test
# imports triton first (torch.compile probes it). Only on machines without a GPU, where the interpreter is the only
# way to run a Triton kernel.
if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

OPERATOR_SUPPORT = str(Path(__file__).resolve().parent / "operator" / "support")
if OPERATOR_SUPPORT not in sys.path:
    sys.path.insert(0, OPERATOR_SUPPORT)


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The built-in model in Hugging Face format (trained once, then cached under $INFERFLEET_CACHE)."""
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model

    return ensure_demo_model()


TINY_LLAMA = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def make_tiny_llama(
    out_dir: Path,
    seed: int = 0,
    max_shard_size: str | None = None,
    classes: tuple[str, str] = ("LlamaConfig", "LlamaForCausalLM"),
    **overrides,
) -> Path:
    """Saves a random-weight transformers LlamaForCausalLM, or the (config, model) classes named (another family
    of the same shape), plus a small tokenizer, to out_dir."""
    import torch
    import transformers

    from inferfleet_runtime.demo import text as demo_text

    torch.manual_seed(seed)
    config = getattr(transformers, classes[0])(**{**TINY_LLAMA, **overrides})
    model = getattr(transformers, classes[1])(config).eval()
    with torch.no_grad():  # default init is tiny; wider weights give less flat logits (fewer argmax near-ties)
        for param in model.parameters():
            if param.dim() >= 2:  # matrices, and a Mixture-of-Experts model's stacked experts
                param.normal_(0.0, 0.15)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **save_kwargs)
    tokenizer = demo_text.train_tokenizer(demo_text.zen_text(), vocab_size=300)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(demo_text.tokenizer_config(256)))
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama_factory(tmp_path_factory):
    """make(name, **config_overrides) -> checkpoint directory; each name is built once per session."""
    built: dict[str, Path] = {}

    def make(name: str, **kwargs) -> Path:
        if name not in built:
            built[name] = make_tiny_llama(tmp_path_factory.mktemp(name), **kwargs)
        return built[name]

    return make
