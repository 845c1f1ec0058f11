"""Serving metrics from request results: TPOT's formula, percentiles, throughput and goodput under SLOs."""

from __future__ import annotations

import pytest

from inferfleet_runtime.bench.client import RequestResult, base_url
from inferfleet_runtime.bench.metrics import parse_goodput, summarize, tpot


def _result(ttft, latency, output_len, prompt_len=10, success=True) -> RequestResult:
    return RequestResult(
        prompt_len,
        output_len,
        success=success,
        output_len=output_len,
        ttft=ttft,
        latency=latency,
        itl=[(latency - ttft) / max(1, output_len - 1)] * max(0, output_len - 1),
    )


def test_tpot_is_decode_time_over_tokens_after_the_first():
    assert tpot(_result(0.2, 1.2, 11)) == pytest.approx(0.1)
    assert tpot(_result(0.2, 0.2, 1)) is None


def test_summary_counts_tokens_throughput_and_percentiles():
    results = [_result(0.1, 1.1, 11), _result(0.3, 0.7, 5), _result(0.0, 0.0, 0, success=False)]
    s = summarize(results, duration_s=2.0)
    assert (s["num_requests"], s["completed"], s["failed"]) == (3, 2, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (20, 16)
    assert s["request_throughput"] == pytest.approx(1.0) and s["output_throughput"] == pytest.approx(8.0)
    assert s["total_token_throughput"] == pytest.approx(18.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0) and s["ttft_ms"]["median"] == pytest.approx(200.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(100.0)
    assert s["e2el_ms"]["p99"] == pytest.approx(1100 - 0.01 * 400)
    assert "goodput" not in s


def test_goodput_counts_requests_meeting_every_slo():
    results = [_result(0.1, 1.1, 11), _result(0.6, 1.0, 5), _result(0.1, 3.1, 11)]  # tpot 100, 100, 300 ms
    s = summarize(results, 4.0, parse_goodput(["ttft:500", "tpot:150"]))
    assert s["num_good_requests"] == 1
    assert s["goodput"] == pytest.approx(0.25) and s["goodput_fraction"] == pytest.approx(1 / 3)
    assert summarize(results, 4.0, {"e2el": 2000})["num_good_requests"] == 2


@pytest.mark.parametrize("items", [["ttft"], ["speed:5"], ["ttft:fast"], ["tpot:0"]])
def test_parse_goodput_refuses_unknown_keys_and_bad_values(items):
    with pytest.raises(ValueError):
        parse_goodput(items)


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_base_url_accepts_the_server_root_or_v1(url):
    assert base_url(url) == "http://h:1/v1"
