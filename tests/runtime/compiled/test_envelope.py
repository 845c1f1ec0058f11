"""Envelope limits and buckets: defaults, bucket choice, refusals."""

from __future__ import annotations

import pytest

from inferfleet_runtime.compiled.envelope import Envelope, EnvelopeError, bucket_for, parse_buckets


def test_default_buckets_cover_the_envelope():
    envelope = Envelope(max_context_length=4096, max_batch_size=12)
    assert envelope.decode_buckets == (1, 2, 4, 8, 12)
    assert envelope.prefill_buckets == (64, 256, 1024, 2048)


def test_small_context_gets_one_prefill_bucket_of_its_own_length():
    assert Envelope(max_context_length=48, max_batch_size=1).prefill_buckets == (48,)


def test_bucket_for_picks_the_smallest_that_holds():
    assert bucket_for((2, 4, 8), 1) == 2
    assert bucket_for((2, 4, 8), 3) == 4
    assert bucket_for((2, 4, 8), 8) == 8
    assert bucket_for((2, 4, 8), 9) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(decode_buckets=(1, 2)), "must be positive and end at --max-batch-size 4"),
        (dict(prefill_buckets=(16, 128)), "must lie in [2, --max-context-length 64]"),
        (dict(tensor_parallel_size=2), "--tensor-parallel-size 2 is not supported"),
        (dict(dtype="int8"), "--dtype must be one of"),
        (dict(max_batch_size=0), "--max-batch-size must be at least 1"),
    ],
)
def test_refuses_envelopes_it_cannot_build(kwargs, message):
    with pytest.raises(EnvelopeError) as info:
        Envelope(**{"max_context_length": 64, "max_batch_size": 4, **kwargs})
    assert message in str(info.value)


def test_parse_buckets_reads_comma_lists_and_refuses_words():
    assert parse_buckets("4,1, 2") == (4, 1, 2)
    with pytest.raises(ValueError, match="comma-separated"):
        parse_buckets("1,two")


def test_envelope_round_trips_through_a_dict():
    envelope = Envelope(max_context_length=64, max_batch_size=4, decode_buckets=(4, 2), prefill_buckets=(16,))
    assert Envelope.from_dict(envelope.to_dict()) == envelope
    assert envelope.decode_buckets == (2, 4)
