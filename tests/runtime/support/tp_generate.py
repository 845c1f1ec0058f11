"""Greedy generation through the paged engine at a given tensor-parallel size, in a process of its own (its rank 0
starts the other ranks): `python tp_generate.py MODEL_DIR TP KERNELS PROMPTS_JSON` prints {"tokens": [...]}."""

from __future__ import annotations

import json
import sys

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams


def main(model_dir: str, tensor_parallel_size: int, kernels: str, prompts: list[list[int]]) -> None:
    config = EngineConfig(
        device="cpu", kernels=kernels, tensor_parallel_size=tensor_parallel_size, block_size=4,
        max_num_batched_tokens=16, num_kv_blocks=64,
    )  # fmt: skip  # small blocks and token budget: prompts are chunked and block tables are not contiguous
    engine = LLMEngine.from_model_dir(model_dir, config)
    outputs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10))
    print(json.dumps({"tokens": [out.outputs[0].token_ids for out in outputs]}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
