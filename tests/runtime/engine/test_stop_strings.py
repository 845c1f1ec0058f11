"""Stop strings: the engine cuts the text before the first one, finds one spanning deltas, holds back a partial one
while streaming (the spec: a search of the whole text each step, below), and reads only the new text and the
held-back characters before it each step, however long the output."""

from hypothesis import given, settings
from hypothesis import strategies as st

from inferfleet_runtime.engine import llm_engine
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine, match_stops, stop_window_start
from inferfleet_runtime.engine.sampling_params import SamplingParams

from ..support.scripted_runner import EOS, ScriptedRunner

PROMPT = "ab"
FIRST_PIECE_ID = 0x1000  # above the prompt's characters
PIECES = ["a", "b", "ab", "ba", "<", "<e", "nd>", "end", ">", "x<end", ""]
MAX_STOP_CHARS = 256


class PieceTokenizer:
    """A token per piece of text (ids from FIRST_PIECE_ID), so one step's delta can be several characters or none;
    the prompt is one token per character."""

    def __init__(self, pieces: list[str]):
        self.pieces = {FIRST_PIECE_ID + i: piece for i, piece in enumerate(pieces)}

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces.get(i, chr(i)) for i in ids if i != EOS)


def stream(pieces: list[str], stops: list[str]) -> tuple[list[str], str]:
    """(the text each step streams, the finish reason) for an output of pieces, one token each."""
    tokenizer = PieceTokenizer(pieces)
    script = "".join(chr(FIRST_PIECE_ID + i) for i in range(len(pieces)))
    runner = ScriptedRunner({PROMPT: script}, num_kv_blocks=64 + len(pieces), max_len=8 + 4 * len(pieces))
    runner.tokenizer = tokenizer
    engine = LLMEngine(runner, EngineConfig(block_size=4))
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=len(pieces), stop=stops, ignore_eos=True))
    deltas, reason = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            [delta] = out.outputs
            deltas.append(delta.text)
            reason = delta.finish_reason
    return deltas, reason


def reference(pieces: list[str], stops: list[str]) -> tuple[list[str], str]:
    """The spec: each step searches the whole text so far; the text is cut before the stop string that begins first;
    while none is found, the longest end that could grow into one is held back."""
    text, num_sent, deltas = "", 0, []
    for piece in pieces:
        text += piece
        starts = [i for i in (text.find(stop) for stop in stops) if i != -1]
        if starts:
            deltas.append(text[num_sent : min(starts)])
            return deltas, "stop"
        held = max((k for stop in stops for k in range(len(stop)) if text.endswith(stop[:k])), default=0)
        num_stable = max(num_sent, len(text) - held)
        deltas.append(text[num_sent:num_stable])
        num_sent = num_stable
    deltas[-1] += text[num_sent:]
    return deltas, "length"


def test_a_stop_string_spanning_two_deltas_is_found_and_cut():
    deltas, reason = stream(["hello <e", "nd> more"], ["<end>"])
    assert "".join(deltas) == "hello " and reason == "stop"
    assert deltas == ["hello ", ""]  # "<e" is held back, never sent


def test_the_stop_string_that_begins_first_wins_among_several():
    deltas, reason = stream(["one tw", "o three"], ["three", "o t", "two"])
    assert deltas == ["one ", ""] and reason == "stop"  # "two" begins first, though listed last


def test_a_stop_string_at_the_very_start_leaves_no_text():
    deltas, reason = stream(["<end>", "after"], ["<end>"])
    assert deltas == [""] and reason == "stop"


def test_a_stop_string_completed_across_many_one_character_deltas_is_found():
    deltas, reason = stream(list("abc<en") + ["", "d", ">tail"], ["<end>"])
    assert "".join(deltas) == "abc" and reason == "stop"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=24),
    st.lists(st.text("ab<end>x", min_size=1, max_size=6), min_size=1, max_size=4),
)
def test_streamed_text_and_finish_match_a_search_of_the_whole_text(piece_list, stops):
    assert stream(piece_list, stops) == reference(piece_list, stops)


def test_a_step_reads_only_the_new_text_and_the_held_back_characters():
    held, new = "<en", "d>"
    text = "x" * 1_000_000 + held + new
    start = stop_window_start(len(text), len(new), len(held))
    assert len(text) - start == len(held) + len(new)
    assert match_stops(text[start:], len(new), ["<end>", "zz"]) == (0, 0)
    assert match_stops(text[start:-1], len(new) - 1, ["<end>"]) == (None, len("<end"))


def test_the_window_searched_stays_bounded_over_a_long_output(monkeypatch):
    searched = []

    def counting(window, num_new_chars, stops):
        searched.append(len(window))
        return match_stops(window, num_new_chars, stops)

    monkeypatch.setattr(llm_engine, "match_stops", counting)
    # 16 stop strings at the protocol's cap, each a near miss of the output; pieces of up to 5 characters.
    stops = ["ab" * 127 + f"{i:02d}" for i in range(16)]
    deltas, reason = stream(["ab", "ba", "x<end", "a"] * 300, stops)
    assert reason == "length" and len("".join(deltas)) == 300 * 10
    assert len(searched) == 1200 and max(searched) <= 5 + MAX_STOP_CHARS - 1
