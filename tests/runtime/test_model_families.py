"""Each model family, built by transformers from its own config and model classes with random weights, decodes
greedily through the paged runtime model token for token as transformers does, on each CPU kernel backend."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from inferfleet_runtime import demo_text
from inferfleet_runtime.config import ConfigError, ModelConfig
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.linear import pack_linears
from inferfleet_runtime.loader import load_model
from inferfleet_runtime.models import SUPPORTED_MODEL_TYPES

from .paged_greedy import greedy_paged, hf_greedy, truncate_after_eos

TINY = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# family -> (transformers config class, model class, config overrides, whether native.c's whole-stack forward
# runs it; where not, the layers run op by op on the native kernels and the load says so once).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6), True),
    "qwen2-tied-window-off": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        # Qwen2.5's own configs name a window but switch it off.
        dict(tie_word_embeddings=True, use_sliding_window=False, sliding_window=32, max_window_layers=1),
        True,
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, rope_theta=1e6), False),
    "qwen3-bias-mqa": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(head_dim=24, num_key_value_heads=1, attention_bias=True),
        False,
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=4), True),
    "phi3-gqa": ("Phi3Config", "Phi3ForCausalLM", dict(), True),
}
BACKENDS = ["reference", "native"]
PROMPT_LENGTHS = [1, 3, 8, 13, 22]
NUM_NEW_TOKENS = 10


def make_checkpoint(out_dir: Path, config_class: str, model_class: str, overrides: dict, seed: int = 0) -> Path:
    """Saves a random-weight transformers model of the family (plus a small tokenizer) to out_dir."""
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**TINY, **overrides})
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # wider than the default init (less flat logits); norms and biases away from 1 and 0
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(1.0, 0.1)
    model.save_pretrained(out_dir)
    tokenizer = demo_text.train_tokenizer(demo_text.zen_text(), vocab_size=300)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(demo_text.tokenizer_config(256)))
    return out_dir


@pytest.fixture(scope="module")
def family_checkpoint(tmp_path_factory):
    built: dict[str, tuple[Path, list[list[int]]]] = {}

    def make(name: str) -> tuple[Path, list[list[int]]]:
        """(checkpoint dir, transformers' greedy outputs for the prompts) of the family, built once per module."""
        if name not in built:
            config_class, model_class, overrides, _ = FAMILIES[name]
            model_dir = make_checkpoint(tmp_path_factory.mktemp(name), config_class, model_class, overrides)
            from transformers import AutoModelForCausalLM

            hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            built[name] = (model_dir, hf_greedy(hf_model, prompts_for(name), NUM_NEW_TOKENS))
        return built[name]

    return make


def prompts_for(name: str) -> list[list[int]]:
    gen = torch.Generator().manual_seed(len(name))
    return [torch.randint(3, 384, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_matches_transformers_for_each_family(family_checkpoint, name, backend, caplog):
    if backend == "native" and native.library() is None:
        pytest.skip(native.unavailable_reason())
    model_dir, expected = family_checkpoint(name)
    # "native" is what a float32 model on a CPU is served with: kernels "auto", every linear packed for native.c.
    lm = load_model(model_dir, device="cpu", kernels="auto" if backend == "native" else "reference")
    assert lm.model.ops.backend == backend
    if backend == "native":
        with caplog.at_level(logging.INFO, logger="inferfleet_runtime"):
            pack_linears(lm.model)
        has_whole_stack = FAMILIES[name][3]
        assert (lm.model.native_weights is not None) == has_whole_stack
        fallbacks = [r.getMessage() for r in caplog.records if "op by op" in r.getMessage()]
        assert len(fallbacks) == (0 if has_whole_stack else 1), fallbacks
    got = greedy_paged(lm.model, prompts_for(name), NUM_NEW_TOKENS, block_size=4, chunk_size=5)
    assert truncate_after_eos(got, lm.config.eos_token_ids) == expected
    # The reference must not be degenerate, or the comparison would prove little.
    assert len({tuple(out) for out in expected}) == len(PROMPT_LENGTHS)
    assert sum(len(out) for out in expected) >= 0.8 * NUM_NEW_TOKENS * len(PROMPT_LENGTHS)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_config_json_picks_the_family(family_checkpoint, name):
    model_dir, _ = family_checkpoint(name)
    hf = json.loads((model_dir / "config.json").read_text())
    assert ModelConfig.from_dir(model_dir).family == hf["model_type"]
    # A config.json without model_type is read by its architectures.
    del hf["model_type"]
    assert ModelConfig.from_hf(hf).family == json.loads((model_dir / "config.json").read_text())["model_type"]


def test_unsupported_family_is_refused_naming_the_supported_ones():
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 10}
    with pytest.raises(ConfigError) as refused:
        ModelConfig.from_hf(hf)
    assert str(refused.value) == f"model_type 'gpt2' is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    assert {"llama", "qwen2", "qwen3", "phi3"} <= set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize(
    "family, change",
    [
        ("qwen2", dict(use_sliding_window=True, sliding_window=32, max_window_layers=0)),
        ("qwen3", dict(layer_types=["full_attention", "sliding_attention"], sliding_window=32)),
        ("phi3", dict(sliding_window=32)),
    ],
)
def test_a_window_shorter_than_the_context_is_refused(family, change):
    hf = {"model_type": family, **TINY, "num_hidden_layers": 2, **change}
    with pytest.raises(ConfigError, match="sliding-window attention \\(sliding_window=32\\) is not supported"):
        ModelConfig.from_hf(hf)
