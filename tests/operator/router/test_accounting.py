"""The picker's accounting as the router keeps it: a finished request's work leaves the endpoint's load estimate."""

from __future__ import annotations

import pytest

from inferfleet_operator.plan.endpoint_picker import (
    Endpoint,
    EndpointMetrics,
    EndpointPicker,
    PickRequest,
    predict_finish,
)
from inferfleet_operator.router.accounting import Ledger
from inferfleet_operator.router.config import DEFAULT_PROFILE

NOW = 100.0
ADDRESS = "http://127.0.0.1:1"


def endpoint() -> Endpoint:
    return Endpoint(ADDRESS, "p", DEFAULT_PROFILE, True, EndpointMetrics(scraped_at=NOW - 0.1))


def send(ledger: Ledger, request: PickRequest, now: float = NOW):
    decision = ledger.picker.pick(request, [endpoint()], now)
    assert decision.endpoint is not None
    return ledger.start(ADDRESS, request, now, is_recorded=True)


def test_the_last_request_finishing_leaves_the_endpoint_as_idle_as_before_it_was_sent():
    ledger = Ledger(EndpointPicker())
    request = PickRequest(num_prompt_tokens=100, num_output_tokens=200)
    idle = predict_finish(request, endpoint(), NOW)
    flight = send(ledger, request)
    assert predict_finish(request, endpoint(), NOW + 0.01, ledger.picker.sent[ADDRESS]) > 1.3 * idle
    ledger.finish(flight)
    sent = ledger.picker.sent[ADDRESS]
    assert (sent.num_prompt_tokens, sent.num_output_tokens, sent.num_requests, sent.recent) == (0, 0, 0, ())
    assert predict_finish(request, endpoint(), NOW + 0.01, sent) == pytest.approx(idle)
    assert ledger.num_in_flight(ADDRESS) == 0


def test_one_of_two_finishing_takes_out_its_share_and_the_other_is_bounded_by_the_tokens_seen_of_it():
    ledger = Ledger(EndpointPicker())
    small, large = PickRequest(0, 100), PickRequest(0, 300)
    first = send(ledger, small)
    second = send(ledger, large, NOW)
    total = ledger.picker.sent[ADDRESS].num_output_tokens
    ledger.finish(first)
    assert ledger.picker.sent[ADDRESS].num_output_tokens == pytest.approx(total * 300 / 400)
    assert ledger.picker.sent[ADDRESS].num_requests == pytest.approx(1)
    assert [entry[2] for entry in ledger.picker.sent[ADDRESS].recent] == [300]
    third = send(ledger, small, NOW)
    second.num_generated = 280  # its stream showed 280 of its 300 tokens: at most 20 left
    ledger.finish(third)
    assert ledger.picker.sent[ADDRESS].num_output_tokens == pytest.approx(20)


def test_a_request_the_picker_did_not_count_leaves_its_accounting_alone():
    ledger = Ledger(EndpointPicker())
    counted = send(ledger, PickRequest(10, 100))
    before = ledger.picker.sent[ADDRESS]
    around = ledger.start(ADDRESS, PickRequest(10, 100), NOW, is_recorded=False)  # FailOpen's choice
    ledger.finish(around)
    assert ledger.picker.sent[ADDRESS] == before and ledger.num_in_flight(ADDRESS) == 1
    ledger.finish(counted)
    assert ledger.picker.sent[ADDRESS].num_requests == 0
