"""Reading what a pod answers while relaying it: a stream split into whole SSE events (so an error event the router
adds never lands inside one) with its output tokens counted, and the usage at the end of a JSON answer."""

from __future__ import annotations

import json
import re

MAX_EVENT_BYTES = 4 << 20  # one event (a chunk with logprobs is a few KB); a pod sending more is treated as failed
TAIL_BYTES = 4096  # the end of a JSON answer kept to read its usage from
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,12})')


class EventSplitter:
    """Splits an SSE byte stream into whole events (each ends in a blank line) and counts what they carry."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self.num_chunks_with_text = 0  # one token each: the runtime sends a chunk per engine step and choice
        self.usage_tokens: int | None = None  # completion_tokens of a usage chunk (stream_options.include_usage)
        self.is_done = False  # [DONE] arrived

    def feed(self, chunk: bytes) -> bytes:
        """The whole events completed by chunk (possibly none); ValueError when one grows over MAX_EVENT_BYTES."""
        self._pending += chunk
        end = max(_end_after(self._pending, b"\n\n"), _end_after(self._pending, b"\r\n\r\n"))
        if end == 0:
            if len(self._pending) > MAX_EVENT_BYTES:
                raise ValueError(f"an event of the upstream stream is over {MAX_EVENT_BYTES} bytes")
            return b""
        events = bytes(self._pending[:end])
        del self._pending[:end]
        for line in events.splitlines():
            if line.startswith(b"data:"):
                self._observe(line[5:].strip())
        return events

    @property
    def num_generated(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.num_chunks_with_text

    def _observe(self, data: bytes) -> None:
        if data == b"[DONE]":
            self.is_done = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        usage = event.get("usage")
        if isinstance(usage, dict) and type(usage.get("completion_tokens")) is int:
            self.usage_tokens = usage["completion_tokens"]
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and (choice.get("text") or _delta_content(choice)):
                self.num_chunks_with_text += 1


def _end_after(data: bytearray, separator: bytes) -> int:
    """Where the last separator in data ends; 0 when there is none."""
    at = data.rfind(separator)
    return at + len(separator) if at >= 0 else 0


def _delta_content(choice: dict):
    delta = choice.get("delta")
    return delta.get("content") if isinstance(delta, dict) else None


def completion_tokens(tail: bytes) -> int:
    """usage.completion_tokens from the end of a JSON answer (the runtime writes usage last); 0 when absent."""
    found = _COMPLETION_TOKENS.findall(tail)
    return int(found[-1]) if found else 0
