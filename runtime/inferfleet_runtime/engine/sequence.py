"""Sequence: the state of one generated sequence (one choice of a request) as the scheduler and engine see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):  # noqa: UP042 (str() and format() keep the 3.11 str-mixin behaviour)
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    ABORT = "abort"  # client went away or the request was cancelled


@dataclass(frozen=True)
class Logprob:
    """Log probability of a sampled token, with the top alternatives (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    prompt_token_ids: list[int]
    index: int = 0  # choice index within its request (n > 1)
    params: Any = None  # SamplingParams; kept opaque so this module imports no torch
    arrival_time: float = 0.0
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, tokens found in the prefix cache at admission
    block_ids: list[int] = field(default_factory=list)  # block table
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of this sequence's full blocks
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    # Engine-side output state (text, logprobs, streaming progress).
    output_text: str = ""
    num_stable_chars: int = 0  # output_text[:num_stable_chars] may be streamed (no partial stop string)
    logprobs: list[Logprob] = field(default_factory=list)
    num_sent_chars: int = 0  # output already handed out (streaming deltas)
    num_sent_tokens: int = 0
    generator: Any = None  # torch.Generator for seeded sampling
    detokenizer: Any = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
