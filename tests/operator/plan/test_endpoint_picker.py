"""The endpoint picker: load in proportion to speed, full batches, unready and stale pods, prefix affinity, liars."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from inferfleet_operator.plan import endpoint_picker as ep
from inferfleet_operator.plan.endpoint_picker import (
    Endpoint,
    EndpointMetrics,
    EndpointPicker,
    PickerSettings,
    PickRequest,
    PoolProfile,
    choose,
)

NOW = 1000.0
BIG_KV = 10_000_000


def profile(speed: float = 1.0, *, max_batch=64, kv=BIG_KV, block_size=16, has_prefix_cache=True) -> PoolProfile:
    """A profile `speed` times the baseline's rates at every prompt length and batch."""
    return PoolProfile(
        prefill=((128, 4000 * speed), (2048, 10000 * speed)),
        decode=((1, 50 * speed), (8, 300 * speed), (64, 1200 * speed)),
        max_batch=max_batch,
        kv_capacity_tokens=kv,
        block_size=block_size,
        has_prefix_cache=has_prefix_cache,
    )


def idle(scraped_at=NOW, **values) -> EndpointMetrics:
    return EndpointMetrics(scraped_at=scraped_at, **values)


def endpoint(name: str, prof: PoolProfile | None = None, metrics=None, *, ready=True, pool="p") -> Endpoint:
    return Endpoint(f"10.0.0.{name}:8000", pool, prof or profile(), ready, idle() if metrics is None else metrics)


REQUEST = PickRequest(num_prompt_tokens=256, num_output_tokens=128)


def prefixed(seed: int, length: int = 64) -> PickRequest:
    rng = random.Random(seed)
    return PickRequest(256, 128, tuple(rng.randrange(32000) for _ in range(length)))


def test_profile_interpolates_between_points_and_clamps_at_the_ends():
    prof = profile()
    assert prof.decode_rate(1) == 50 and prof.decode_rate(0) == 50
    assert prof.decode_rate(36) == pytest.approx(750)
    assert prof.decode_rate(500) == 1200
    assert prof.prefill_rate(1088) == pytest.approx(7000)


@pytest.mark.parametrize("points", [(), ((1, 0.0),), ((1, -5.0),), ((1, math.nan),), ((1, 10.0), (1, 20.0))])
def test_profile_refuses_points_without_a_positive_rate(points):
    with pytest.raises(ValueError, match="decode"):
        PoolProfile(((128, 1.0),), points, 8, 1000, 16, False)


@pytest.mark.parametrize("speed", [2.0, 3.0, 5.0])
def test_fast_endpoint_takes_load_in_proportion_to_speed(speed):
    picker = EndpointPicker()
    endpoints = [endpoint("1", profile(speed)), endpoint("2", profile(1.0))]
    counts = Counter(picker.pick(REQUEST, endpoints, NOW).endpoint.address for _ in range(600))
    fast_share = counts["10.0.0.1:8000"] / 600
    assert fast_share == pytest.approx(speed / (speed + 1), abs=0.04)


def test_full_batch_endpoint_loses_to_idle_slower_one_only_when_the_prediction_says_so():
    slow = endpoint("2", profile(1.0))
    queue = {"num_waiting": 64, "num_queued_prompt_tokens": 64 * 256, "num_queued_output_tokens": 64 * 128}
    full = idle(num_running=64, num_running_tokens=64 * 100, **queue)
    decision = choose(REQUEST, [endpoint("1", profile(3.0), full), slow], NOW, {})
    assert decision.endpoint == slow
    light = idle(num_running=4, num_running_tokens=4 * 100)
    assert choose(REQUEST, [endpoint("1", profile(3.0), light), slow], NOW, {}).endpoint.address == "10.0.0.1:8000"


def test_full_batch_waits_for_a_slot_that_a_batch_with_room_does_not():
    work = {"num_running_tokens": 6400}
    full = endpoint("1", metrics=idle(num_running=64, **work))
    room = endpoint("2", metrics=idle(num_running=63, **work))
    decision = choose(REQUEST, [full, room], NOW, {})
    assert decision.endpoint == room
    assert choose(REQUEST, [full], NOW, {}).predicted_s > decision.predicted_s


def test_endpoint_whose_kv_cannot_hold_the_request_waits_for_it():
    full_kv = endpoint("1", profile(kv=50_000), idle(kv_utilisation=0.99, num_running=3, num_running_tokens=300))
    roomy = endpoint("2", profile(kv=50_000), idle(kv_utilisation=0.5, num_running=3, num_running_tokens=300))
    assert choose(PickRequest(2000, 500), [full_kv, roomy], NOW, {}).endpoint == roomy


def test_request_larger_than_every_kv_cache_gets_no_endpoint():
    decision = choose(PickRequest(900, 200), [endpoint("1", profile(kv=1000))], NOW, {})
    assert (decision.endpoint, decision.reason) == (None, ep.REASON_NONE_FITS)


def test_unready_and_never_scraped_endpoints_are_never_picked():
    unready = endpoint("1", profile(10.0), ready=False)
    silent = Endpoint("10.0.0.2:8000", "p", profile(10.0), True, None)
    slow_busy = endpoint("3", profile(1.0), idle(num_running=64, num_queued_output_tokens=50_000))
    picker = EndpointPicker()
    assert {picker.pick(REQUEST, [unready, silent, slow_busy], NOW).endpoint for _ in range(20)} == {slow_busy}
    decision = picker.pick(REQUEST, [unready, silent], NOW)
    assert (decision.endpoint, decision.reason) == (None, ep.REASON_NONE_READY)


def test_no_endpoints_gives_a_decision_with_a_reason():
    decision = EndpointPicker().pick(REQUEST, [], NOW)
    assert (decision.endpoint, decision.reason, decision.predicted_s) == (None, ep.REASON_NO_ENDPOINTS, None)


def test_stale_metrics_fall_back_to_the_pickers_own_accounting():
    settings = PickerSettings(stale_after_s=2.0, unreachable_after_s=30.0)
    stale = endpoint("1", metrics=idle(NOW - 10, num_running=64, num_queued_output_tokens=1e6))
    fresh = endpoint("2")
    picker = EndpointPicker(settings)
    decisions = [picker.pick(REQUEST, [stale, fresh], NOW) for _ in range(100)]
    # The stale report of a huge queue is ignored: both equal pods share the traffic by what the picker sent.
    assert Counter(d.endpoint.address for d in decisions)["10.0.0.1:8000"] == pytest.approx(50, abs=3)
    assert {d.is_metrics_stale for d in decisions if d.endpoint == stale} == {True}
    assert {d.is_metrics_stale for d in decisions if d.endpoint == fresh} == {False}


def test_sends_since_the_last_scrape_count_on_top_of_its_report():
    """Two equal pods report the same load; what the picker sends after that scrape must alternate them."""
    reported = idle(num_running=8, num_running_tokens=20 * 128)
    endpoints = [endpoint("1", metrics=reported), endpoint("2", metrics=reported)]
    picker = EndpointPicker()
    counts = Counter(picker.pick(REQUEST, endpoints, NOW + 0.01).endpoint.address for _ in range(20))
    assert sorted(counts.values()) == [10, 10]


def test_metrics_older_than_the_unreachable_bound_are_never_picked():
    gone = endpoint("1", profile(10.0), idle(NOW - 31))
    busy = endpoint("2", profile(1.0), idle(num_queued_output_tokens=1e5))
    decision = choose(REQUEST, [gone, busy], NOW, {}, PickerSettings(unreachable_after_s=30.0))
    assert decision.endpoint == busy
    assert choose(REQUEST, [gone], NOW, {}).reason == ep.REASON_NONE_READY


def test_same_prefix_sticks_to_one_endpoint_whatever_the_order():
    endpoints = [endpoint(str(i)) for i in range(8)]
    homes = {}
    for seed in range(40):
        shuffled = endpoints[:]
        random.Random(seed).shuffle(shuffled)
        picks = {choose(prefixed(seed), order, NOW, {}).endpoint for order in (endpoints, shuffled, endpoints[::-1])}
        assert len(picks) == 1
        homes[seed] = picks.pop()
        assert choose(prefixed(seed), endpoints, NOW, {}).reason == ep.REASON_PREFIX_AFFINITY
    assert len(set(homes.values())) >= 5  # prefixes spread over the endpoints
    # Removing one endpoint moves only the prefixes that lived on it.
    removed = endpoints[0]
    rest = endpoints[1:]
    moved = [s for s, home in homes.items() if home != removed and choose(prefixed(s), rest, NOW, {}).endpoint != home]
    assert moved == []


def test_prefix_spills_over_when_its_home_exceeds_the_load_bound():
    endpoints = [endpoint(str(i)) for i in range(4)]
    request = prefixed(1)
    home = choose(request, endpoints, NOW, {}).endpoint
    loaded = [
        endpoint(e.address.split(".")[-1].split(":")[0], metrics=idle(num_running_tokens=20_000, num_running=32))
        if e == home
        else e
        for e in endpoints
    ]
    decision = choose(request, loaded, NOW, {})
    assert decision.endpoint != home and decision.reason == ep.REASON_PREFIX_SPILLOVER
    # Repeated sends of one prefix fill the home up to the bound, then spread: no endpoint takes them all.
    picker = EndpointPicker()
    counts = Counter(picker.pick(request, endpoints, NOW).endpoint for _ in range(200))
    assert counts[home] == max(counts.values()) and counts[home] < 200 * 0.5


def test_affinity_ignored_for_engines_without_prefix_cache():
    endpoints = [endpoint(str(i), profile(has_prefix_cache=False)) for i in range(6)]
    picker = EndpointPicker()
    decisions = [picker.pick(prefixed(3), endpoints, NOW) for _ in range(60)]
    assert {d.reason for d in decisions} == {ep.REASON_LEAST_FINISH}
    assert set(Counter(d.endpoint for d in decisions).values()) == {10}


def test_affinity_stays_among_endpoints_of_the_best_ones_block_size():
    fast_32 = [endpoint(str(i), profile(3.0, block_size=32)) for i in range(2)]
    slow_16 = [endpoint(str(i), profile(1.0, block_size=16)) for i in range(10, 16)]
    for seed in range(30):
        decision = choose(prefixed(seed), slow_16 + fast_32, NOW, {})
        assert decision.endpoint in fast_32 and decision.reason == ep.REASON_PREFIX_AFFINITY


def test_prompt_shorter_than_one_block_has_no_affinity():
    endpoints = [endpoint(str(i)) for i in range(4)]
    assert choose(prefixed(1, length=15), endpoints, NOW, {}).reason == ep.REASON_LEAST_FINISH


def test_endpoint_reporting_an_empty_queue_forever_does_not_take_all_traffic():
    """Four equal pods near capacity; honest ones report what they hold, the liar always reports nothing."""
    prof = profile()
    rate = prof.decode_rate(64)
    cost_s = REQUEST.num_prompt_tokens / prof.prefill_rate(REQUEST.num_prompt_tokens) + REQUEST.num_output_tokens / rate
    held_s = dict.fromkeys(range(4), 0.0)  # seconds of work each pod holds
    picker = EndpointPicker()
    counts = Counter()
    dt = cost_s / 4 / 0.9  # arrivals at 90% of the four pods' capacity
    for step in range(3000):
        now = NOW + step * dt
        for i in held_s:
            held_s[i] = max(0.0, held_s[i] - dt)
        reported = {i: idle(now, num_running_tokens=held_s[i] * rate) for i in range(1, 4)} | {0: idle(now)}
        endpoints = [endpoint(str(i), prof, reported[i]) for i in range(4)]
        chosen = int(picker.pick(REQUEST, endpoints, now).endpoint.address.split(".")[-1].split(":")[0])
        held_s[chosen] += cost_s
        counts[chosen] += 1
    assert counts[0] / 3000 < 0.35  # fair share 0.25; believing the report would give it nearly all


HOSTILE = [math.nan, -1.0, -math.inf, math.inf, 1e300, -1e300]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_metric_values_are_clamped_and_never_crash(value):
    metrics = EndpointMetrics(
        scraped_at=NOW,
        num_queued_prompt_tokens=value,
        num_queued_output_tokens=value,
        num_running_tokens=value,
        num_running=value,
        num_waiting=value,
        kv_utilisation=value,
        observed_tokens_per_s=value,
    )
    for name in ("num_queued_prompt_tokens", "num_queued_output_tokens", "num_running_tokens"):
        assert 0 <= getattr(metrics, name) <= ep.MAX_TOKENS
    assert 0 <= metrics.kv_utilisation <= 1
    assert metrics.observed_tokens_per_s is None or 0 < metrics.observed_tokens_per_s <= ep.MAX_RATE
    hostile = endpoint("1", profile(), metrics)
    honest = endpoint("2", profile(), idle(num_running=8, num_running_tokens=800, observed_tokens_per_s=300))
    picker = EndpointPicker()
    decisions = [picker.pick(REQUEST, [hostile, honest], NOW + i * 0.01) for i in range(100)]
    assert all(d.endpoint is not None and math.isfinite(d.predicted_s) for d in decisions)
    assert sum(d.endpoint == honest for d in decisions) >= 20  # the hostile pod of the same profile cannot draw all


@pytest.mark.parametrize("scraped_at", [math.nan, math.inf, -math.inf])
def test_unreadable_metrics_timestamp_is_never_picked(scraped_at):
    decision = choose(REQUEST, [endpoint("1", metrics=EndpointMetrics(scraped_at=scraped_at))], NOW, {})
    assert (decision.endpoint, decision.reason) == (None, ep.REASON_NONE_READY)


def test_observed_rate_refines_the_profile():
    """Two pods of one profile; one is seen running at a quarter of it, so it gets less new work."""
    slow_seen = endpoint("1", metrics=idle(num_running=8, num_running_tokens=800, observed_tokens_per_s=75))
    as_profiled = endpoint("2", metrics=idle(num_running=8, num_running_tokens=800, observed_tokens_per_s=300))
    picker = EndpointPicker()
    counts = Counter(picker.pick(REQUEST, [slow_seen, as_profiled], NOW).endpoint for _ in range(300))
    assert counts[as_profiled] > 1.3 * counts[slow_seen]
