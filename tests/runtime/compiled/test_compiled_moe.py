"""A Mixture-of-Experts model through the compiled engine (AOTInductor on the CPU): exported with every expert
computed densely under the routing weights, it gives the paged engine's greedy tokens."""

from __future__ import annotations

import pytest

from inferfleet_runtime.cli import main
from inferfleet_runtime.compiled.runner import make_compiled_engine
from inferfleet_runtime.engine import LLMEngine
from inferfleet_runtime.engine_config import EngineConfig
from inferfleet_runtime.sampling import SamplingParams

from ..test_model_families import make_checkpoint

pytestmark = pytest.mark.slow


def test_compiled_mixtral_matches_paged(tmp_path):
    model = make_checkpoint(
        tmp_path / "mixtral", "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)
    )
    out = tmp_path / "engine"
    args = ["--max-context-length", "64", "--max-batch-size", "2", "--decode-buckets", "2", "--prefill-buckets", "16"]
    code = main(
        ["compile", "--model", str(model), "--out", str(out), "--backend", "aotinductor", "--device", "cpu", *args]
    )
    assert code == 0
    prompts = [[5, 9, 30, 41], list(range(3, 23))]  # the second one prefilled in two 16-token chunks
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    paged = LLMEngine.from_model_dir(model, EngineConfig(max_num_seqs=2, device="cpu"))
    compiled = make_compiled_engine(out, EngineConfig(device="cpu"))
    expected = [o.outputs[0].token_ids for o in paged.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == expected
    assert len(set(expected[0] + expected[1])) > 4  # not a degenerate repetition
