"""LLMEngine on the built-in model: prefix-cache hits, preemption, chunking and aborts never change outputs."""

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferfleet_runtime.checkpoints.loader import load_model
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams
from inferfleet_runtime.layers.attention_backend import kv_cache_bytes_per_block
from inferfleet_runtime.worker.model_runner import ModelRunner

# Prompts sharing prefixes of several blocks (block size 4 below), so prefix caching has something to hit.
PROMPTS = [
    "Beautiful is better than",
    "Beautiful is better than ugly.\nExplicit is",
    "Simple is better than",
    "Simple is better than complex.\nComplex is better than",
    "Errors should never pass silently.\n",
    "Now is better than never.\nAlthough never is often better than",
]
SAMPLING = [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=8, frequency_penalty=0.5),
    SamplingParams(temperature=1.2, seed=5, n=3, max_tokens=6, ignore_eos=True),
]


@pytest.fixture(scope="module")
def loaded(demo_model_dir):
    return load_model(demo_model_dir, kernels="reference")


def make_engine(loaded, **config) -> LLMEngine:
    config = EngineConfig(block_size=4, **config)
    return LLMEngine(ModelRunner(loaded, config), config)


@pytest.fixture(scope="module")
def reference(loaded):
    """Each (prompt, sampling) generated alone, with room to spare and no prefix caching."""

    @functools.cache
    def generate(prompt_index: int, sampling_index: int) -> list[list[int]]:
        engine = make_engine(loaded, num_kv_blocks=256, enable_prefix_caching=False)
        [out] = engine.generate([PROMPTS[prompt_index]], SAMPLING[sampling_index])
        return [choice.token_ids for choice in out.outputs]

    return generate


def test_prefix_cache_hits_on_a_repeated_prompt(loaded, reference):
    engine = make_engine(loaded, num_kv_blocks=64)
    first = engine.generate([PROMPTS[3]], SAMPLING[0])[0]
    second = engine.generate([PROMPTS[3]], SAMPLING[0])[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens >= 8
    assert second.outputs[0].token_ids == first.outputs[0].token_ids == reference(3, 0)[0]


@pytest.mark.slow
def test_preemption_happens_and_outputs_match(loaded, reference):
    engine = make_engine(loaded, num_kv_blocks=14, enable_prefix_caching=False)
    outs = engine.generate(PROMPTS, SAMPLING[0])
    assert engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [reference(i, 0)[0] for i in range(len(PROMPTS))]


requests = st.lists(
    st.tuples(
        st.integers(0, len(PROMPTS) - 1), st.integers(0, len(SAMPLING) - 1), st.one_of(st.none(), st.integers(0, 12))
    ),  # step at which it is aborted
    min_size=1,
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reqs=requests,
    num_kv_blocks=st.integers(12, 40),
    budget=st.sampled_from([3, 8, 64]),
    caching=st.booleans(),
    max_num_seqs=st.integers(1, 6),
)
def test_outputs_equal_the_unbatched_reference_under_any_schedule(
    loaded, reference, reqs, num_kv_blocks, budget, caching, max_num_seqs
):
    engine = make_engine(
        loaded,
        num_kv_blocks=num_kv_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        max_num_seqs=max_num_seqs,
    )
    tokens: dict[tuple[str, int], list[int]] = {}
    aborted = set()
    for i, (p, s, _) in enumerate(reqs):
        engine.add_request(f"r{i}", PROMPTS[p], SAMPLING[s])
    step = 0
    while engine.has_unfinished_requests():
        for i, (_, _, abort_at) in enumerate(reqs):
            if abort_at == step and engine.abort_request(f"r{i}"):
                aborted.add(f"r{i}")
        for out in engine.step():
            for delta in out.outputs:
                tokens.setdefault((out.request_id, delta.index), []).extend(delta.token_ids)
        step += 1
        assert step < 2_000
    for i, (p, s, _) in enumerate(reqs):
        want = reference(p, s)
        got = [tokens.get((f"r{i}", index), []) for index in range(len(want))]
        if f"r{i}" in aborted:
            assert all(g == w[: len(g)] for g, w in zip(got, want))
        else:
            assert got == want
    assert engine.block_manager.num_used_blocks == 0
    assert all(engine.block_manager.ref_count(b) == 0 for b in range(num_kv_blocks))


def test_incremental_detokenizer_never_splits_a_character(loaded):
    from inferfleet_runtime.engine.detokenizer import IncrementalDetokenizer

    tokenizer = loaded.tokenizer
    text = "Beautiful is better than ugly — café, naïve, 日本語, 🐍 done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt, output = ids[:3], ids[3:]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add(t) for t in output] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(output)
    assert not any("\ufffd" in d for d in deltas)


def test_kv_pool_is_sized_from_a_memory_budget(loaded):
    bytes_per_block = kv_cache_bytes_per_block(loaded.config, 4)
    engine = make_engine(loaded, kv_cache_memory=bytes_per_block * 37 + 5)
    assert engine.runner.num_kv_blocks == engine.block_manager.num_blocks == 37
    assert engine.runner.kv_caches[0][0].shape[:2] == (37, 4)


def test_bfloat16_engine_generates_with_a_bfloat16_cache(demo_model_dir):
    config = EngineConfig(block_size=4, num_kv_blocks=32, dtype="bfloat16", kernels="reference")
    engine = LLMEngine.from_model_dir(demo_model_dir, config)
    assert engine.runner.kv_caches[0][0].dtype == torch.bfloat16
    [out] = engine.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6))
    assert out.outputs[0].text.startswith(" ugly")


def test_default_cpu_pool_holds_every_running_sequence_at_full_length(loaded):
    engine = make_engine(loaded, max_num_seqs=3, max_context_length=100)
    assert engine.runner.num_kv_blocks == 3 * 25  # 100 tokens in blocks of 4, well within the 1 GiB budget
