"""What the router reads of a request body before choosing a pod: the fields the picker needs, checked, and nothing
forwarded for a body that fails (the pod checks every other field itself)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from inferfleet_operator.plan.endpoint_picker import PickRequest
from inferfleet_operator.router.errors import RouterError

CHARS_PER_TOKEN = 4  # a text prompt's length estimate: no tokenizer in the router
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for completions
DEFAULT_CHAT_TOKENS = 256  # chat without max_tokens runs to a stop or the context end: a typical answer's length
NUM_PREFIX_IDS = 256  # token ids kept for the picker's prefix key (it hashes up to 4 KV blocks of them)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class RoutedRequest:
    body: bytes  # forwarded as received
    model: str
    is_stream: bool
    pick: PickRequest


def parse_body(path: str, body: bytes) -> RoutedRequest:
    """The request's picker estimate; RouterError 400 naming the field when the body cannot be routed."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RouterError(400, f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RouterError(400, "The request body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model: a model name is required", param="model")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise RouterError(400, "stream: must be true or false", param="stream")
    n = _positive_int(data, "n") or 1
    if path == CHAT:
        num_prompt_tokens, prefix_ids, num_prompts = _chat_prompt(data.get("messages")), (), 1
        max_tokens = _positive_int(data, "max_completion_tokens") or _positive_int(data, "max_tokens")
        max_tokens = max_tokens or DEFAULT_CHAT_TOKENS
    else:
        num_prompt_tokens, prefix_ids, num_prompts = _completion_prompt(data.get("prompt"))
        max_tokens = _positive_int(data, "max_tokens") or DEFAULT_COMPLETION_TOKENS
    pick = PickRequest(num_prompt_tokens, num_prompts * n * max_tokens, prefix_ids)
    return RoutedRequest(body, model, bool(stream), pick)


def _positive_int(data: dict, name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise RouterError(400, f"{name}: must be an integer of at least 1", param=name)
    return value


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def _is_ids(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(type(t) is int and t >= 0 for t in value)


def _completion_prompt(prompt) -> tuple[int, tuple[int, ...], int]:
    """(prompt tokens, the first prompt's leading ids or (), number of prompts) of str | [str] | [int] | [[int]]."""
    if isinstance(prompt, str):
        return _text_tokens(prompt), (), 1
    if _is_ids(prompt):
        return len(prompt), tuple(prompt[:NUM_PREFIX_IDS]), 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(_text_tokens(p) for p in prompt), (), len(prompt)
        if all(_is_ids(p) for p in prompt):
            return sum(len(p) for p in prompt), tuple(prompt[0][:NUM_PREFIX_IDS]), len(prompt)
    raise RouterError(
        400,
        "prompt: must be a string, a non-empty list of strings, a non-empty list of token ids, or a list of them",
        param="prompt",
    )


def _chat_prompt(messages) -> int:
    """Prompt tokens of a conversation: its text at CHARS_PER_TOKEN, plus a few tokens a message for the template."""
    if not isinstance(messages, list) or not messages:
        raise RouterError(400, "messages: must be a non-empty list of messages", param="messages")
    num_tokens = 0
    for i, message in enumerate(messages):
        text = _message_text(message)
        if text is None:
            message = f"messages.{i}: must be an object with a role, and content a string or a list of text parts"
            raise RouterError(400, message, param=f"messages.{i}")
        num_tokens += 4 + _text_tokens(text)
    return num_tokens


def _message_text(message) -> str | None:
    """A message's text; None when it is not a message."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return None
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None
