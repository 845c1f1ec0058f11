"""LLMEngine over a scripted stand-in model: stop conditions, streaming deltas, n > 1, abort, preemption."""

import pytest

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import ContextLengthError, LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams

from ..support.scripted_runner import EOS, ScriptedRunner


def make_engine(scripts, **config):
    runner = ScriptedRunner(scripts, num_kv_blocks=config.pop("num_kv_blocks", 64))
    return LLMEngine(runner, EngineConfig(block_size=4, **config))


def run_to_end(engine):
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return outputs


def test_generates_the_continuation_and_stops_at_eos():
    engine = make_engine({"ab": "cdef"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=10))
    assert out.outputs[0].text == "cdef" and out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].token_ids == [ord(c) for c in "cdef"] + [EOS]
    assert engine.block_manager.num_used_blocks == 0


def test_max_tokens_ends_with_length():
    engine = make_engine({"ab": "cdefgh"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=3))
    assert out.outputs[0].text == "cde" and out.outputs[0].finish_reason == "length"


def test_ignore_eos_continues_past_eos():
    engine = make_engine({"ab": "c"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=3, ignore_eos=True))
    assert out.outputs[0].token_ids == [ord("c"), EOS, EOS] and out.outputs[0].finish_reason == "length"


def test_stop_token_ids_end_the_choice_without_their_text():
    engine = make_engine({"ab": "cdef"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=10, stop_token_ids=[ord("e")]))
    assert out.outputs[0].text == "cd" and out.outputs[0].finish_reason == "stop"


def test_stop_string_is_cut_from_the_output():
    engine = make_engine({"ab": "hello world. more"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=20, stop=["d.", "zz"]))
    assert out.outputs[0].text == "hello worl" and out.outputs[0].finish_reason == "stop"


def test_streaming_holds_back_a_partial_stop_string():
    engine = make_engine({"ab": "xy<en<end>tail"})
    engine.add_request("r", "ab", SamplingParams(max_tokens=20, stop=["<end>"]))
    deltas = [d.text for out in run_to_end(engine) for d in out.outputs]
    # "<", "<e", "<en" are held back until the next "<" shows they do not start the stop string; the
    # final "<end" is never sent.
    assert [d for d in deltas if d] == ["x", "y", "<en"]


def test_n_choices_share_the_prompt_blocks():
    prompt = "abcdefghij"  # two full blocks of 4, then a partial one
    engine = make_engine({prompt: "kl"}, enable_prefix_caching=False)
    engine.add_request("r", prompt, SamplingParams(n=3, max_tokens=2))
    outs = engine.step()  # prompt computed: the other two choices are forked
    [parent, *children] = engine._requests["r"].seqs
    assert len(children) == 2
    assert all(c.block_ids[:2] == parent.block_ids[:2] and c.num_computed_tokens == 8 for c in children)
    assert engine.block_manager.ref_count(parent.block_ids[0]) == 3
    outs += run_to_end(engine)
    texts = {}
    for out in outs:
        for d in out.outputs:
            texts[d.index] = texts.get(d.index, "") + d.text
    assert texts == {0: "kl", 1: "kl", 2: "kl"}
    assert engine.block_manager.num_used_blocks == 0


def test_abort_frees_the_requests_blocks_at_once():
    engine = make_engine({"abcdefg": "hijklmnop"})
    engine.add_request("r", "abcdefg", SamplingParams(max_tokens=9))
    engine.step()
    assert engine.block_manager.num_used_blocks == 2
    assert engine.abort_request("r")
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
    assert not engine.abort_request("r")


def test_preempted_request_resumes_with_the_same_output():
    scripts = {"aaaa": "bcdefghijk", "zzzz": "yxwvutsrqp"}
    roomy = make_engine(scripts, num_kv_blocks=64)
    want = [o.outputs[0].text for o in roomy.generate(list(scripts), SamplingParams(max_tokens=10))]
    tight = make_engine(scripts, num_kv_blocks=5)
    got = [o.outputs[0].text for o in tight.generate(list(scripts), SamplingParams(max_tokens=10))]
    assert tight.scheduler.num_preemptions > 0
    assert got == want


def test_refuses_requests_longer_than_the_context_stating_the_numbers():
    engine = make_engine({}, max_context_length=16)
    with pytest.raises(ContextLengthError, match=r"16 tokens.*requested 20 tokens \(10 in the prompt, 10 in"):
        engine.add_request("r", "a" * 10, SamplingParams(max_tokens=10))


def test_context_limit_is_capped_by_the_kv_pool():
    engine = make_engine({}, num_kv_blocks=3)
    assert engine.max_context_length == 12


def test_logprobs_follow_the_tokens():
    engine = make_engine({"ab": "cd"})
    [out] = engine.generate(["ab"], SamplingParams(max_tokens=5, logprobs=1))
    assert [lp.token_id for lp in out.outputs[0].logprobs] == out.outputs[0].token_ids
