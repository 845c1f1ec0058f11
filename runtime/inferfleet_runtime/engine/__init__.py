"""The engine loop: requests in, token deltas out (scheduler, block manager, sequences, detokenizer); imports no torch.

The offline API: `from inferfleet_runtime.engine import LLMEngine, SamplingParams`.
"""

from inferfleet_runtime.engine.llm_engine import LLMEngine, RequestOutput
from inferfleet_runtime.engine.sampling_params import SamplingParams

__all__ = ["LLMEngine", "RequestOutput", "SamplingParams"]
