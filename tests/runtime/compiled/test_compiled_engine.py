"""The compiled engine against the paged engine: same greedy tokens for the same prompts, in every bucket."""

from __future__ import annotations

import pytest

from inferfleet_runtime.compiled.runner import make_compiled_engine
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "Beautiful is better than",
    "Explicit is",
    "Simple is better than complex. Complex is better than",
    "Errors should never pass silently. Unless explicitly silenced. In the face of ambiguity,",  # > 16 tokens
    "Now is better than never.",
    "Flat is better than nested. Sparse is",
]


@pytest.fixture(scope="module")
def paged(demo_model_dir):
    return LLMEngine.from_model_dir(demo_model_dir, EngineConfig(max_num_seqs=4))


class _Counting:
    """Wraps a graph to count its calls."""

    def __init__(self, graph, counts, key):
        self.graph, self.counts, self.key = graph, counts, key

    def __call__(self, *args):
        self.counts[self.key] = self.counts.get(self.key, 0) + 1
        return self.graph(*args)


@pytest.fixture(scope="module")
def compiled(compiled_demo_engine):
    engine = make_compiled_engine(compiled_demo_engine, EngineConfig())
    engine.graph_calls = {}
    runner = engine.runner
    runner.graphs = {key: _Counting(g, engine.graph_calls, key) for key, g in runner.graphs.items()}
    return engine


def _greedy(engine, prompts, max_tokens):
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    return [out.outputs[0].token_ids for out in engine.generate(prompts, params)]


def test_single_prompt_matches_paged_through_the_padded_smallest_bucket(paged, compiled):
    compiled.graph_calls.clear()
    assert _greedy(compiled, PROMPTS[:1], [12]) == _greedy(paged, PROMPTS[:1], [12])
    assert compiled.graph_calls == {("prefill", 16): 1, ("decode", 2): 11}


def test_concurrent_batch_matches_paged_as_it_shrinks_across_buckets(paged, compiled):
    compiled.graph_calls.clear()
    prompts, lengths = PROMPTS[:4], [4, 9, 14, 20]  # 4 running, then 3 (bucket 4), 2 and 1 (bucket 2)
    assert _greedy(compiled, prompts, lengths) == _greedy(paged, prompts, lengths)
    assert compiled.graph_calls[("decode", 4)] > 0 and compiled.graph_calls[("decode", 2)] > 0
    # a prompt runs in pieces of at most 16 tokens: the long one needs more than one
    lengths = [len(compiled.encode(p)) for p in prompts]
    assert max(lengths) > 16
    assert compiled.graph_calls[("prefill", 16)] == sum(-(-n // 16) for n in lengths)


def test_more_requests_than_slots_reuse_slots_and_match_paged(paged, compiled):
    lengths = [6, 3, 8, 5, 7, 2]  # six requests on four slots: the last two wait for finished ones' slots
    assert _greedy(compiled, PROMPTS, lengths) == _greedy(paged, PROMPTS, lengths)


def test_chunked_prefill_under_a_small_token_budget_matches_paged(demo_model_dir, compiled_demo_engine, paged):
    engine = make_compiled_engine(compiled_demo_engine, EngineConfig(max_num_batched_tokens=7))
    small_paged = LLMEngine.from_model_dir(demo_model_dir, EngineConfig(max_num_seqs=4, max_num_batched_tokens=7))
    prompts, lengths = PROMPTS[2:5], [5, 10, 3]
    assert (
        _greedy(engine, prompts, lengths) == _greedy(small_paged, prompts, lengths) == _greedy(paged, prompts, lengths)
    )


def test_choices_forked_from_a_long_prompt_copy_its_cached_prefix(paged, compiled):
    prompt = PROMPTS[3]
    assert len(compiled.encode(prompt)) > 16  # a full block is shared with the second choice
    out = compiled.generate([prompt], SamplingParams(temperature=0, max_tokens=10, n=2, ignore_eos=True))[0]
    expected = _greedy(paged, [prompt], [10])[0]
    assert [c.token_ids for c in out.outputs] == [expected, expected]


def test_compiled_engine_caps_context_and_batch_at_the_envelope(compiled):
    assert compiled.max_context_length == 64
    assert compiled.scheduler.max_num_seqs == 4
    assert compiled.block_manager.num_blocks == 4 * 4  # 4 slots of 64 tokens in blocks of 16
    with pytest.raises(ValueError, match="maximum context length is 64 tokens"):
        compiled.check_length(60, 5)


def test_choices_that_finish_at_different_steps_free_their_slots_and_match_paged(paged, compiled):
    # Seeded sampling gives each choice its own stream, the same in both engines. The stop token is the first sample
    # of a choice whose first token differs from choice 0's: that choice ends on its first token, the others go on.
    prompt = PROMPTS[4]

    def params(seed, stop=()):
        return SamplingParams(temperature=1.5, seed=seed, max_tokens=8, n=3, ignore_eos=True, stop_token_ids=list(stop))

    for seed in range(20):
        firsts = [c.token_ids[0] for c in paged.generate([prompt], params(seed))[0].outputs]
        if len(set(firsts)) > 1:
            break
    else:
        pytest.fail("no seed in 20 gave choices with different first tokens")
    stopper = next(i for i, t in enumerate(firsts) if t != firsts[0])
    expected = [c.token_ids for c in paged.generate([prompt], params(seed, [firsts[stopper]]))[0].outputs]
    got = [c.token_ids for c in compiled.generate([prompt], params(seed, [firsts[stopper]]))[0].outputs]
    assert got == expected
    assert len(got[stopper]) == 1 and len(got[0]) > 1  # one ended on its first token while another went on
    # Every slot came back: a full batch of new requests still runs and matches, and no block is held.
    lengths = [5, 5, 5, 5]
    assert _greedy(compiled, PROMPTS[:4], lengths) == _greedy(paged, PROMPTS[:4], lengths)
    assert compiled.block_manager.num_free_blocks == compiled.block_manager.num_blocks


# Every shape of an n > 1 request whose first choice (the parent, whose computed prompt the others copy) ends on its
# first token, over a prompt longer than one 16-token block (so each forked choice copies the parent's first block),
# in one batch with another client's request: (n, how the parent ends, whether the other choices go on).
FIRST_TOKEN_ENDS = [
    pytest.param(2, "length", False, id="n2-max-tokens-1"),
    pytest.param(3, "length", False, id="n3-max-tokens-1"),
    pytest.param(2, "stop-token", False, id="n2-every-choice-stop-token"),
    pytest.param(3, "eos", False, id="n3-every-choice-eos"),
    pytest.param(3, "stop-token", True, id="n3-parent-stop-token-others-go-on"),
    pytest.param(2, "eos", True, id="n2-parent-eos-other-goes-on"),
]


def _first_token_end_params(paged, prompt, n, how, others_go_on):
    """SamplingParams of the request and the token that ends its first choice on its first token."""
    if not others_go_on:  # greedy: every choice draws the same first token
        base = dict(temperature=0, n=n)
        first = _greedy(paged, [prompt], [1])[0][0]
    else:  # seeded: each choice its own stream, the same in both engines; a seed where choice 0 draws alone
        for seed in range(40):
            base = dict(temperature=1.5, seed=seed, n=n)
            params = SamplingParams(max_tokens=1, ignore_eos=True, **base)
            firsts = [c.token_ids[0] for c in paged.generate([prompt], params)[0].outputs]
            if firsts[0] not in firsts[1:]:
                first = firsts[0]
                break
        else:
            pytest.fail(f"no seed in 40 gave choice 0 a first token of its own among {n} choices")
    if how == "length":
        return SamplingParams(max_tokens=1, ignore_eos=True, **base), first
    if how == "stop-token":
        return SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=[first], **base), first
    return SamplingParams(max_tokens=8, ignore_eos=False, **base), first


@pytest.mark.parametrize(("n", "how", "others_go_on"), FIRST_TOKEN_ENDS)
def test_choices_whose_parent_ends_on_its_first_token_match_paged_beside_another_request(
    paged, compiled, monkeypatch, n, how, others_go_on
):
    prompt = PROMPTS[3]
    assert len(compiled.encode(prompt)) > 16  # the forked choices copy the parent's first block from its slot
    params, first = _first_token_end_params(paged, prompt, n, how, others_go_on)
    if how == "eos":  # the first token is the end of sequence, in both engines
        monkeypatch.setattr(paged, "eos_token_ids", {first})
        monkeypatch.setattr(compiled, "eos_token_ids", {first})
    other = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)  # another client, in the same batches

    def run(engine):
        outs = engine.generate([prompt, PROMPTS[0]], [params, other])
        return [[(c.token_ids, c.finish_reason) for c in out.outputs] for out in outs]

    expected = run(paged)
    assert run(compiled) == expected
    choices = expected[0]
    assert len(choices) == n and choices[0] == ([first], "length" if how == "length" else "stop")
    assert any(len(tokens) > 1 for tokens, _ in choices[1:]) == others_go_on
    assert len(expected[1][0][0]) == 6  # the other client's request ran to its end
    # The parent's slot and every choice's came back: a full batch still runs and matches, and no block is held.
    lengths = [5, 5, 5, 5]
    assert _greedy(compiled, PROMPTS[:4], lengths) == _greedy(paged, PROMPTS[:4], lengths)
    assert compiled.block_manager.num_free_blocks == compiled.block_manager.num_blocks


def test_choices_forked_under_a_small_token_budget_keep_their_copied_prefix(
    demo_model_dir, compiled_demo_engine, paged
):
    # Under a 7-token budget the forked choices run steps after their parent ended on its first token, while other
    # requests' chunks take the slots it gave up.
    engine = make_compiled_engine(compiled_demo_engine, EngineConfig(max_num_batched_tokens=7))
    small_paged = LLMEngine.from_model_dir(demo_model_dir, EngineConfig(max_num_seqs=4, max_num_batched_tokens=7))
    prompts = [PROMPTS[3], PROMPTS[2], PROMPTS[5]]
    params = [
        SamplingParams(temperature=0, max_tokens=1, n=3),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    ]

    def run(engine):
        return [[(c.token_ids, c.finish_reason) for c in out.outputs] for out in engine.generate(prompts, params)]

    assert run(engine) == run(small_paged)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
