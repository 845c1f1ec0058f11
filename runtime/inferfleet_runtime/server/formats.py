"""OpenAI response bodies and stream chunks for completions and chat, built from engine outputs."""

from __future__ import annotations

import time

from inferfleet_runtime.engine.llm_engine import CompletionOutput


def usage(num_prompt: int, num_completion: int) -> dict:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }


class CompletionFormat:
    """Completions response and stream chunks in OpenAI's shape."""

    id_prefix = "cmpl"

    def __init__(self, model: str, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    def _base(self, request_id: str, obj: str) -> dict:
        return {"id": request_id, "object": obj, "created": int(time.time()), "model": self.model}

    def _logprobs(self, choice: CompletionOutput, text_offset: int = 0):
        if not choice.logprobs:
            return None
        tokens, offsets = [], []
        for lp in choice.logprobs:
            offsets.append(text_offset)
            tokens.append(self.tokenizer.decode([lp.token_id], skip_special_tokens=False))
            text_offset += len(tokens[-1])
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in choice.logprobs],
            "top_logprobs": [
                {self.tokenizer.decode([t], skip_special_tokens=False): v for t, v in lp.top} for lp in choice.logprobs
            ],
            "text_offset": offsets,
        }

    def first_chunk(self, request_id: str, index: int):
        return None

    def chunk(self, request_id: str, index: int, delta: CompletionOutput) -> dict:
        return {
            **self._base(request_id, "text_completion"),
            "choices": [
                {
                    "index": index,
                    "text": delta.text,
                    "logprobs": self._logprobs(delta),
                    "finish_reason": delta.finish_reason,
                }
            ],
        }

    def usage_chunk(self, request_id: str, usage: dict) -> dict:
        return {**self._base(request_id, "text_completion"), "choices": [], "usage": usage}

    def response(self, request_id: str, choices: list[CompletionOutput], num_prompt: int, num_completion: int):
        return {
            **self._base(request_id, "text_completion"),
            "choices": [
                {"index": c.index, "text": c.text, "logprobs": self._logprobs(c), "finish_reason": c.finish_reason}
                for c in choices
            ],
            "usage": usage(num_prompt, num_completion),
        }


class ChatFormat(CompletionFormat):
    """Chat completions response and stream chunks in OpenAI's shape."""

    id_prefix = "chatcmpl"

    def _entry(self, token_id: int, logprob: float) -> dict:
        token = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    def _logprobs(self, choice: CompletionOutput, text_offset: int = 0):
        if not choice.logprobs:
            return None
        return {
            "content": [
                {**self._entry(lp.token_id, lp.logprob), "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
                for lp in choice.logprobs
            ]
        }

    def first_chunk(self, request_id: str, index: int) -> dict:
        return {
            **self._base(request_id, "chat.completion.chunk"),
            "choices": [
                {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }

    def chunk(self, request_id: str, index: int, delta: CompletionOutput) -> dict:
        content = {"content": delta.text} if delta.text else {}
        return {
            **self._base(request_id, "chat.completion.chunk"),
            "choices": [
                {
                    "index": index,
                    "delta": content,
                    "logprobs": self._logprobs(delta),
                    "finish_reason": delta.finish_reason,
                }
            ],
        }

    def usage_chunk(self, request_id: str, usage: dict) -> dict:
        return {**self._base(request_id, "chat.completion.chunk"), "choices": [], "usage": usage}

    def response(self, request_id: str, choices: list[CompletionOutput], num_prompt: int, num_completion: int):
        return {
            **self._base(request_id, "chat.completion"),
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": self._logprobs(c),
                    "finish_reason": c.finish_reason,
                }
                for c in choices
            ],
            "usage": usage(num_prompt, num_completion),
        }
