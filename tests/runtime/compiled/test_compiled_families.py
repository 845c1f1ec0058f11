"""Each family through the compiled engine (AOTInductor on the CPU): exported from the same model classes the
paged engine runs, it gives the paged engine's greedy tokens (which the family tests hold equal to transformers').
The cases cover what the export must carry: q/k/v biases and tied embeddings (qwen2), per-head q/k norms (qwen3),
checkpoints stored fused and a sliding window (phi3), Gemma's post-norms, GeGLU-tanh, soft-capping and a window
(gemma2), a second RoPE table for local layers (gemma3), and a Mixture-of-Experts layer, exported with every expert
computed densely under the routing weights (mixtral)."""

from __future__ import annotations

import pytest

from inferfleet_runtime.cli import main
from inferfleet_runtime.compiled.runner import make_compiled_engine
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams

from ..support.family_checkpoints import CASES, make_checkpoint

pytestmark = pytest.mark.slow

FAMILIES = ["qwen2-tied-window-off", "qwen3", "phi3-window", "gemma2-window", "gemma3-text-window", "mixtral"]


@pytest.mark.parametrize("name", FAMILIES)
def test_compiled_family_matches_paged(tmp_path, name):
    case = CASES[name]
    model = make_checkpoint(tmp_path / name, case.config_class, case.model_class, case.overrides)
    out = tmp_path / "engine"
    args = ["--max-context-length", "64", "--max-batch-size", "2", "--decode-buckets", "2", "--prefill-buckets", "16"]
    code = main(
        ["compile", "--model", str(model), "--out", str(out), "--backend", "aotinductor", "--device", "cpu", *args]
    )
    assert code == 0
    prompts = [[5, 9, 30, 41], list(range(3, 23))]  # the second one prefilled in two 16-token chunks, past windows
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    paged = LLMEngine.from_model_dir(model, EngineConfig(max_num_seqs=2, device="cpu"))
    compiled = make_compiled_engine(out, EngineConfig(device="cpu"))
    expected = [o.outputs[0].token_ids for o in paged.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == expected
    assert len(set(expected[0] + expected[1])) > 4  # not a degenerate repetition
