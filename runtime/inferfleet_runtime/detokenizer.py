"""IncrementalDetokenizer: turns a growing list of token ids into text deltas, never splitting a character."""

from __future__ import annotations

# Prompt tokens decoded with the first output tokens, so a tokenizer that spells spaces by context
# (SentencePiece) gets the first output word right.
NUM_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0               # ids[prefix_offset:read_offset] is text already emitted
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        """The text that token_id completes; "" while it ends inside a multi-byte character."""
        self.ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of the output)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=self.skip_special_tokens)
        new_text = decode(self.ids[self.prefix_offset:], skip_special_tokens=self.skip_special_tokens)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text[len(prefix_text):]
