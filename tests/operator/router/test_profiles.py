"""Pool profiles: a pool without one learns a single speed for all its pods from their observed output rates."""

from __future__ import annotations

import pytest

from inferfleet_operator.plan.endpoint_picker import EndpointMetrics, PoolProfile
from inferfleet_operator.router.config import DEFAULT_PROFILE, EndpointSpec
from inferfleet_operator.router.endpoints import EndpointTable
from inferfleet_operator.router.profiles import PoolProfiles

CONFIGURED = PoolProfile(((128, 9000),), ((1, 100), (8, 640)), 64, 300_000, 16, True)


def running(rate: float, now: float = 1.0) -> EndpointMetrics:
    return EndpointMetrics(scraped_at=now, num_running=1, observed_tokens_per_s=rate)


def test_a_profile_less_pool_moves_towards_what_its_pods_do_and_its_pods_share_the_result():
    table = EndpointTable(PoolProfiles({"h100": CONFIGURED}))
    table.sync(
        [EndpointSpec("http://a:1", "cpu"), EndpointSpec("http://b:1", "cpu"), EndpointSpec("http://c:1", "h100")]
    )
    for _ in range(30):
        table.update("http://a:1", True, running(40 * DEFAULT_PROFILE.decode_rate(1)), None)
    cpu = table.profiles.profile_for("cpu")
    assert cpu.decode_rate(1) == pytest.approx(40 * DEFAULT_PROFILE.decode_rate(1), rel=0.06)
    assert cpu.prefill_rate(128) == pytest.approx(40 * DEFAULT_PROFILE.prefill_rate(128), rel=0.06)
    profiles = {e.address: e.profile for e in table.endpoints()}
    assert profiles["http://a:1"] is profiles["http://b:1"] is cpu
    table.update("http://c:1", True, running(1e6), None)
    assert table.profiles.profile_for("h100") is CONFIGURED  # a measured profile is the picker's to blend


def test_an_idle_scrape_teaches_nothing():
    profiles = PoolProfiles({})
    assert not profiles.observe("cpu", EndpointMetrics(scraped_at=1.0, observed_tokens_per_s=500.0))
    assert profiles.profile_for("cpu") is DEFAULT_PROFILE
