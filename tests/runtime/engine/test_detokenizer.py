"""IncrementalDetokenizer: its deltas are exactly those of the two-decode reference, on the byte-level fast path
and through tokenizer.decode, including multi-byte characters split across tokens and special tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet_runtime.engine.detokenizer import NUM_CONTEXT_TOKENS, IncrementalDetokenizer, _byte_table


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    from inferfleet_runtime.checkpoints.tokenizer import Tokenizer

    return Tokenizer.from_dir(demo_model_dir)


def reference_deltas(tokenizer, prompt, output, skip_special_tokens=True):
    """The detokenizer as it was: two tokenizer.decode calls per token, nothing cached."""
    ids = list(prompt[-NUM_CONTEXT_TOKENS:])
    prefix, read = 0, len(ids)
    deltas = []

    def emit(final):
        nonlocal prefix, read
        prefix_text = tokenizer.decode(ids[prefix:read], skip_special_tokens=skip_special_tokens)
        new_text = tokenizer.decode(ids[prefix:], skip_special_tokens=skip_special_tokens)
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        prefix, read = read, len(ids)
        return new_text[len(prefix_text) :]

    for token_id in output:
        ids.append(token_id)
        deltas.append(emit(False))
    deltas.append(emit(True))
    return deltas


def deltas_of(tokenizer, prompt, output, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens)
    return [detok.add(t) for t in output] + [detok.flush()]


def test_the_demo_tokenizer_takes_the_byte_level_fast_path(tokenizer):
    assert _byte_table(tokenizer) is not None


MULTI_BYTE = "Beautiful is better than ugly — café, naïve, 日本語, 🐍 done."


@pytest.mark.parametrize("split", [0, 1, 3, 7])
def test_multi_byte_characters_split_across_tokens_match_a_full_decode(tokenizer, split):
    ids = tokenizer.encode(MULTI_BYTE, add_special_tokens=False)
    assert len(ids) > len(MULTI_BYTE.encode()) // 2, "the demo vocabulary spells these characters in byte tokens"
    prompt, output = ids[:split], ids[split:]
    deltas = deltas_of(tokenizer, prompt, output)
    assert deltas == reference_deltas(tokenizer, prompt, output)
    assert "".join(deltas) == tokenizer.decode(output)
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas[:-1], "some token ends inside a character and is held back"


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_skipped_or_kept_as_a_full_decode_does(tokenizer, skip):
    eos = tokenizer.eos_token_ids[0]
    ids = tokenizer.encode("naïve 🐍", add_special_tokens=False)
    output = ids[:2] + [eos] + ids[2:] + [eos]
    deltas = deltas_of(tokenizer, [eos, 7, 8], output, skip)
    assert deltas == reference_deltas(tokenizer, [eos, 7, 8], output, skip)
    assert "".join(deltas) == tokenizer.decode(output, skip_special_tokens=skip)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_token_streams_give_the_reference_deltas(tokenizer, data):
    vocab = tokenizer.vocab_size
    token = st.integers(0, vocab - 1)
    prompt = data.draw(st.lists(token, min_size=1, max_size=8))
    output = data.draw(st.lists(token, max_size=24))
    skip = data.draw(st.booleans())
    assert deltas_of(tokenizer, prompt, output, skip) == reference_deltas(tokenizer, prompt, output, skip)
    window = prompt + output
    assert IncrementalDetokenizer(tokenizer, [], skip)._decode_ids(window) == tokenizer.decode(window, skip)


class CharTokenizer:
    """A tokenizer without a byte-level backend: the detokenizer must go through decode()."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(0x61 + i) if i < 26 else ("" if skip_special_tokens else "<s>") for i in ids)


def test_a_tokenizer_without_the_byte_level_decoder_goes_through_decode():
    tokenizer = CharTokenizer()
    assert _byte_table(tokenizer) is None
    output = [7, 4, 11, 26, 11, 14]
    assert deltas_of(tokenizer, [0, 1], output) == reference_deltas(tokenizer, [0, 1], output)
    assert "".join(deltas_of(tokenizer, [0], output, False)) == "hel<s>lo"


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40), split=st.integers(0, 40), skip=st.booleans())
def test_encoded_text_streams_give_the_reference_deltas_and_the_full_text(tokenizer, text, split, skip):
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt, output = ids[:split] or [7], ids[split:]
    deltas = deltas_of(tokenizer, prompt, output, skip)
    assert deltas == reference_deltas(tokenizer, prompt, output, skip)
    if not any("\ufffd" in tokenizer.decode(part, skip) for part in (prompt, output)):  # split between characters
        assert "".join(deltas) == tokenizer.decode(output, skip)
