"""Each model family, built by transformers from its own config and model classes with random weights, decodes
greedily through the paged runtime model token for token as transformers does, on each CPU kernel backend."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.compiled.step import StaticStep
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams
from inferfleet_runtime.kernels import native
from inferfleet_runtime.layers.attention_backend import PagedAttention, allocate_kv_cache, build_attention_metadata
from inferfleet_runtime.layers.linear import pack_linears
from inferfleet_runtime.model_config import ConfigError
from inferfleet_runtime.models import FAMILIES, SUPPORTED_MODEL_TYPES, read_config, read_config_dir
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support import family_checkpoints
from ..support.family_checkpoints import CASES, NUM_NEW_TOKENS, PROMPT_LENGTHS, TINY, prompts_for
from ..support.paged_greedy import greedy_paged, truncate_after_eos

family_checkpoint = family_checkpoints.family_checkpoint  # the families' checkpoints, built once per module

BACKENDS = ["reference", "native"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_for_each_family(family_checkpoint, name, backend, caplog):
    if backend == "native" and native.library() is None:
        pytest.skip(native.unavailable_reason())
    model_dir, expected, _ = family_checkpoint(name)
    case = CASES[name]
    # "native" is what a float32 model on a CPU is served with: kernels "auto", every linear packed for native.c.
    with caplog.at_level(logging.INFO, logger="inferfleet_runtime"):
        lm = load_model(model_dir, device="cpu", kernels="auto" if backend == "native" else "reference")
        if backend == "native":
            pack_linears(lm.model)
    assert lm.model.ops.backend == backend
    messages = [record.getMessage() for record in caplog.records]
    if backend == "native":
        assert (lm.model.native_weights is not None) == case.has_native_forward
    # Each fallback is said once, at load, and only where there is one.
    op_by_op = [m for m in messages if "op by op" in m]
    assert len(op_by_op) == (backend == "native" and not case.has_native_forward), messages
    reference_ops = [m for m in messages if "torch reference ops for" in m]
    assert len(reference_ops) == (backend == "native" and case.has_reference_only_ops), messages
    got = greedy_paged(lm.model, prompts_for(name), NUM_NEW_TOKENS, block_size=4, chunk_size=5)
    assert truncate_after_eos(got, lm.config.eos_token_ids) == expected
    # The reference must not be degenerate, or the comparison would prove little.
    assert len({tuple(out) for out in expected}) == len(PROMPT_LENGTHS)
    assert sum(len(out) for out in expected) >= 0.8 * NUM_NEW_TOKENS * len(PROMPT_LENGTHS)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [name for name in CASES if name.endswith("-window")])
def test_engine_serves_windowed_families_as_transformers_through_prefix_hits_and_chunks(
    family_checkpoint, name, backend
):
    # The engine's own block tables: 7-token prefill chunks over 4-token blocks, and the prompts run a second time
    # from the prefix cache, whose blocks the windows start inside.
    if backend == "native" and native.library() is None:
        pytest.skip(native.unavailable_reason())
    model_dir, expected, _ = family_checkpoint(name)
    lm = load_model(model_dir, device="cpu", kernels=backend)
    config = EngineConfig(block_size=4, num_kv_blocks=96, max_num_batched_tokens=7, kernels=backend, device="cpu")
    engine = LLMEngine(ModelRunner(lm, config), config)
    greedy = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    for _ in range(2):
        outputs = engine.generate(prompts_for(name), greedy)
        got = [output.outputs[0].token_ids for output in outputs]
        assert truncate_after_eos(got, lm.config.eos_token_ids) == expected
    assert engine.block_manager.num_prefix_hit_tokens >= 8  # the second round hit at least the longest prompts' blocks


@pytest.mark.parametrize("name", list(CASES))
@torch.inference_mode()
def test_logits_match_transformers_for_each_family(family_checkpoint, name):
    # Greedy tokens cannot see what keeps the argmax (Gemma 2's final soft-capping): the logits can.
    checkpoint = family_checkpoint(name)
    lm = load_model(checkpoint.model_dir, device="cpu", kernels="reference")
    prompt, block_size = prompts_for(name)[-1], 4
    num_blocks = -(-len(prompt) // block_size)
    kv_caches = allocate_kv_cache(lm.config, num_blocks + 1, block_size, torch.device("cpu"))
    meta, positions = build_attention_metadata(
        [list(range(1, num_blocks + 1))], [len(prompt)], [len(prompt)], block_size
    )
    hidden = lm.model(torch.tensor(prompt), positions, PagedAttention(kv_caches, meta, lm.model.ops))
    torch.testing.assert_close(lm.model.compute_logits(hidden), checkpoint.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
@torch.inference_mode()
def test_compiled_engines_static_step_matches_transformers_for_each_family(family_checkpoint, name):
    # What the compiled engine exports (StaticStep over static KV slots), run eagerly: a prompt prefilled in two
    # padded chunks, the second over the first one's cached keys and values.
    checkpoint = family_checkpoint(name)
    lm = load_model(checkpoint.model_dir, device="cpu", kernels="reference")
    c, prompt, bucket, context = lm.config, prompts_for(name)[-1], 16, 32
    step = StaticStep(lm.model, context).eval()
    kv = torch.zeros(c.num_layers, 2, 1, context, c.num_kv_heads, c.head_dim)
    for start in range(0, len(prompt), bucket):
        piece = prompt[start : start + bucket]
        ids = torch.tensor([piece + [0] * (bucket - len(piece))])
        logits, new_kv = step(ids, torch.tensor([start]), torch.tensor([len(piece)]), torch.tensor([0]), kv)
        kv[:, :, 0, start : start + len(piece)] = new_kv[:, :, 0, : len(piece)]
    torch.testing.assert_close(logits[0], checkpoint.logits[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_config_json_picks_the_family(family_checkpoint, name):
    model_dir = family_checkpoint(name).model_dir
    hf = json.loads((model_dir / "config.json").read_text())
    family = read_config_dir(model_dir).family
    assert FAMILIES[hf["model_type"]].name == family
    # A config.json without model_type is read by its architectures.
    del hf["model_type"]
    assert read_config(hf).family == family


def test_unsupported_family_is_refused_naming_the_supported_ones():
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 10}
    with pytest.raises(ConfigError) as refused:
        read_config(hf)
    assert str(refused.value) == f"model_type 'gpt2' is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    assert {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe"} <= set(
        SUPPORTED_MODEL_TYPES
    )


@pytest.mark.parametrize(
    "family, change, windows",
    [
        ("mistral", dict(sliding_window=32), (32, 32, 32)),
        ("mistral", dict(sliding_window=None), ()),
        # transformers' default where config.json names no window
        ("mistral", dict(max_position_embeddings=32768), (4096, 4096, 4096)),
        ("llama", dict(), ()),
        ("qwen2", dict(use_sliding_window=True, sliding_window=32, max_window_layers=1), (None, 32, 32)),
        ("qwen2", dict(use_sliding_window=False, sliding_window=32, max_window_layers=0), ()),
        (
            "qwen3",
            dict(
                use_sliding_window=True,
                sliding_window=32,
                layer_types=["full_attention", "sliding_attention", "full_attention"],
            ),
            (None, 32, None),
        ),
        ("phi3", dict(sliding_window=2047), (2047, 2047, 2047)),
        ("phi3", dict(sliding_window=4096), ()),  # as long as the context: full attention
        ("gemma2", dict(sliding_window=32), (32, None, 32)),
        ("gemma3_text", dict(sliding_window=32, sliding_window_pattern=3), (32, 32, None)),
        (
            "gemma3_text",
            dict(sliding_window=32, layer_types=["full_attention", "sliding_attention", "full_attention"]),
            (None, 32, None),
        ),
    ],
)
def test_each_layers_sliding_window_is_read_from_config_json(family, change, windows):
    hf = {"model_type": family, **TINY, "num_hidden_layers": 3, "max_position_embeddings": 4096, **change}
    config = read_config(hf)
    assert config.sliding_windows == windows
    assert [config.window_of(i) for i in range(3)] == list(windows or (None, None, None))


@pytest.mark.parametrize("window", [0, -4, "8", 8.5])
def test_a_window_of_no_whole_tokens_is_refused(window):
    hf = {"model_type": "mistral", **TINY, "sliding_window": window}
    with pytest.raises(ConfigError, match="sliding_window must be a positive number of tokens"):
        read_config(hf)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_bidirectional_attention_is_refused(family):
    hf = {"model_type": family, **TINY, "sliding_window": 32, "use_bidirectional_attention": True}
    with pytest.raises(ConfigError, match="bidirectional attention \\(use_bidirectional_attention\\) is not supported"):
        read_config(hf)
