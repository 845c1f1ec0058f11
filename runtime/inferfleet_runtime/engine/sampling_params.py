"""SamplingParams: what a request asks for (penalties, temperature, top-k/p, min-p, seed, stops, logprobs), checked on creation."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20
GREEDY_TEMPERATURE = 1e-5  # temperatures below this sample greedily
_SEED_STRIDE = 0x9E3779B1  # choice i of a seeded request draws with seed + i * stride


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_k: int | None = None  # None: no top-k cut
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16  # None: up to the context limit
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's plus the top k alternatives
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            ("n", self.n >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0, "must not be negative"),
            ("top_k", self.top_k is None or self.top_k >= 1, "must be at least 1"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be positive"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be at least 1"),
            (
                "logprobs",
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                f"must be in [0, {MAX_LOGPROBS}]",
            ),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
        ]
        for name, ok, message in checks:
            if not ok:
                raise ValueError(f"{name} {message}, got {getattr(self, name)!r}")

    @property
    def is_greedy(self) -> bool:
        # Below GREEDY_TEMPERATURE, logits / temperature overflows float32 to inf and the draw is undefined: such a
        # temperature asks for the most likely token, which is what greedy gives.
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def num_held_per_token(self) -> int:
        """What one output token costs in a request's output budget: its id and text, plus with logprobs=k its
        logprob and k alternatives, all held until the answer is sent."""
        return 1 if self.logprobs is None else 2 + self.logprobs

    def num_budget_tokens(self, max_tokens: list[int]) -> int:
        """A request's size in its output budget: n choices of each prompt, up to its max_tokens (resolved) each."""
        return self.n * sum(max_tokens) * self.num_held_per_token

    def seed_for(self, index: int) -> int | None:
        return None if self.seed is None else (self.seed + index * _SEED_STRIDE) % (1 << 63)
