"""Request bodies of the OpenAI-compatible API (pydantic), and their translation to SamplingParams.

Bodies are validated strictly: no type coercion (`true` is not a token id, `"2"` is not `n`), finite numbers only,
text without lone surrogates, bounded lists, and no parameter the server does not know. OpenAI parameters the
server does not implement are refused by name (UNSUPPORTED) rather than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from inferfleet_runtime.engine.sampling_params import MAX_LOGPROBS, SamplingParams

MAX_N = 16
MAX_PROMPTS = 64  # prompts in one completions request
MAX_STOP = 16  # stop strings, each at most MAX_STOP_CHARS
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 256
SEED_RANGE = (-(2**63), 2**64 - 1)


def _valid_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "lone_surrogate",
            "text holds a lone surrogate ({char}) at character {index}: send valid UTF-8 text",
            {"char": f"U+{ord(exc.object[exc.start]):04X}", "index": exc.start},
        ) from None
    return text


Text = Annotated[str, AfterValidator(_valid_text)]
TokenIds = Annotated[list[int], Field(min_length=1)]
StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]

# OpenAI parameters with no effect here: each is refused by name unless it holds its no-op value.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None,),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "store": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: Text
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    user: Annotated[Text, Field(max_length=256)] | None = None  # accepted, no effect
    # Beyond OpenAI (as vLLM accepts them).
    top_k: int | None = Field(default=None, ge=-1)  # -1 or 0: no top-k cut
    min_p: float = Field(default=0.0, ge=0, le=1)
    repetition_penalty: float = Field(default=1.0, gt=0, le=10)
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # Refused unless they hold their no-op value (UNSUPPORTED).
    logit_bias: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    store: Any = None

    @field_validator(
        "logit_bias",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "parallel_tool_calls",
        "response_format",
        "store",
        mode="before",
    )
    @classmethod
    def _refuse_unsupported(cls, value, info):
        return refuse_unless_noop(info.field_name, value)

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=self.top_k if self.top_k and self.top_k > 0 else None,
            top_p=1.0 if self.top_p is None else self.top_p,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            max_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def refuse_unless_noop(name: str, value):
    if any(value == noop and type(value) is type(noop) for noop in UNSUPPORTED[name]):
        return value
    raise PydanticCustomError("unsupported_parameter", "not supported by this server")


class CompletionRequest(_SamplingFields):
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: Any = None
    best_of: Any = None

    @field_validator("suffix", "best_of", mode="before")
    @classmethod
    def _refuse_unsupported_completion(cls, value, info):
        return refuse_unless_noop(info.field_name, value)

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: one text or token list each."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Annotated[Text, Field(max_length=256)] | None = None  # accepted, not passed to the template

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    metadata: Annotated[dict[str, Annotated[Text, Field(max_length=512)]], Field(max_length=16)] | None = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None

    @field_validator("audio", "modalities", "prediction", "reasoning_effort", "web_search_options", mode="before")
    @classmethod
    def _refuse_unsupported_chat(cls, value, info):
        return refuse_unless_noop(info.field_name, value)

    @property
    def resolved_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
