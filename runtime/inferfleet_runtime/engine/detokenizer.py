"""IncrementalDetokenizer: turns a growing list of token ids into text deltas, never splitting a character.

The text of a window of ids is what tokenizer.decode gives for it. For a tokenizer whose decoder is the plain
byte-level one (GPT-2 style BPE: each token stands for a fixed run of bytes, the text is the UTF-8 of their
concatenation with U+FFFD for invalid bytes), the window is decoded here from a per-token bytes table instead,
which gives the same text without a call into the tokenizer; any other decoder, or a window holding a token
the table cannot spell (an added token not skipped, an unknown id), goes through tokenizer.decode. A prefix
window's text is decoded once; on the byte path it is usually known already (the delta just emitted), so a
token costs one decode.

Not tokenizers' DecodeStream: seeded with the prompt's last tokens it emits their text when the prompt ends
inside a character, and it has no flush for a trailing incomplete character, so its deltas differ from the
reference (two decodes per token) on 38 of 166 prompt/output splits of valid text and on half of random
token streams (checked against tests/runtime/engine/test_detokenizer.py's reference).
"""

from __future__ import annotations

import weakref

# Prompt tokens decoded with the first output tokens, so a tokenizer that spells spaces by context
# (SentencePiece) gets the first output word right.
NUM_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0  # ids[prefix_offset:read_offset] is text already emitted
        self.read_offset = len(self.ids)
        self._prefix_text: str | None = None  # decode(ids[prefix_offset:read_offset]) once known
        self._by_bytes = False
        table = _byte_table(tokenizer)
        self._bytes = None if table is None else table.bytes_for(skip_special_tokens)

    def add(self, token_id: int) -> str:
        """The text that token_id completes; "" while it ends inside a multi-byte character."""
        self.ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of the output)."""
        return self._emit(final=True)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._decode_ids(self.ids[start:end])

    def _decode_ids(self, ids: list[int]) -> str:
        """decode(ids); self._by_bytes says whether the bytes table spelt it."""
        table = self._bytes
        if table is not None:
            try:
                text = b"".join([table[i] for i in ids]).decode("utf-8", "replace")
                self._by_bytes = True
                return text
            except (KeyError, TypeError, IndexError):  # a token the table cannot spell: the tokenizer decodes
                pass
        self._by_bytes = False
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emit(self, final: bool) -> str:
        prefix_text = self._prefix_text
        if prefix_text is None:  # the prefix window moved and its text is not known: decode it
            prefix_text = self._prefix_text = self._decode(self.prefix_offset, self.read_offset)
        new_text = self._decode(self.prefix_offset)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        delta = new_text[len(prefix_text) :]
        # Text the bytes table spelt without U+FFFD came from valid UTF-8: the old prefix window ended on a
        # character boundary, so the delta is exactly the text of the new prefix window.
        exact = self._by_bytes and "\ufffd" not in prefix_text and "\ufffd" not in delta
        self._prefix_text = delta if exact else None
        return delta


# -- byte-level fast path -----------------------------------------------------------------------------------------
class _ByteTable:
    """Per-token bytes of a byte-level BPE vocabulary; None for a token the plain byte mapping does not cover."""

    def __init__(self, backend):
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()  # id -> AddedToken
        table: list[bytes | None] = [None] * size
        for i in range(size):
            if i in added:
                continue  # added tokens: the tokenizer decodes them
            token = backend.id_to_token(i)
            if token is None:
                continue
            try:
                table[i] = bytes(byte_of[c] for c in token)
            except KeyError:
                continue  # not a pure byte-level token: leave to the tokenizer
        self._plain = table
        skipping = list(table)
        for i, token in added.items():
            if token.special and i < size:
                skipping[i] = b""  # skip_special_tokens drops it from the text
        self._skipping = skipping

    def bytes_for(self, skip_special_tokens: bool) -> list[bytes | None]:
        return self._skipping if skip_special_tokens else self._plain


_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _byte_table(tokenizer) -> _ByteTable | None:
    """The bytes table for tokenizer (our Tokenizer wrapper) when its decoder is the plain byte-level one."""
    try:
        table = _tables.get(tokenizer, False)
    except TypeError:  # not weak-referenceable: no fast path
        return None
    if table is not False:
        return table
    table = None
    backend = getattr(tokenizer, "backend", None)
    try:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.decoders import ByteLevel

        if isinstance(backend, HFTokenizer) and isinstance(backend.decoder, ByteLevel):
            table = _ByteTable(backend)
    except ImportError:
        table = None
    _tables[tokenizer] = table
    return table


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are spelt in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping
