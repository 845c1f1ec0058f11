"""leadership.py: kopf's pause rule read from the peering object, and how often it is read."""

import asyncio
import datetime

from inferfleet_operator.controller.leadership import CHECK_SECONDS, Leadership, is_paused
from inferfleet_operator.controller.settings import parse_args
from inferfleet_operator.kube.client import ApiError

NOW = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)


def _peer(priority, seen_seconds_ago=0, lifetime=60):
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - datetime.timedelta(seconds=seen_seconds_ago)).isoformat(),
    }


def test_a_live_peer_of_higher_priority_pauses_and_nothing_else_does():
    assert is_paused({"me": _peer(100), "other": _peer(200)}, 100, NOW)
    assert not is_paused({"me": _peer(100), "other": _peer(200, seen_seconds_ago=61)}, 100, NOW), "dead peer"
    assert not is_paused({"me": _peer(200), "other": _peer(100)}, 200, NOW)
    assert not is_paused({"me": _peer(100), "twin": _peer(100)}, 100, NOW), "a tie cannot be told from self"
    assert not is_paused({}, 100, NOW) and not is_paused(None, 100, NOW)
    assert not is_paused({"junk": "x", "other": {"priority": 300}}, 100, NOW), "entries kopf did not write"


class FakeKube:
    def __init__(self, status):
        self.status, self.reads = status, []

    async def get(self, api_version, kind, namespace, name):
        self.reads.append((api_version, kind, namespace, name))
        if isinstance(self.status, Exception):
            raise self.status
        return {"metadata": {"name": name}, "status": self.status}


def test_the_peering_object_is_read_at_most_every_few_seconds_and_a_failed_read_keeps_the_last_answer():
    clock = [0.0]
    kube = FakeKube({"me": _peer(100), "other": _peer(200)})
    config = parse_args(["--peering=fleet"], default_instance="x")
    leadership = Leadership(kube, config, 100, monotonic=lambda: clock[0], now=lambda: NOW)

    async def go():
        assert not await leadership.is_active()
        assert not await leadership.is_active()
        assert kube.reads == [("kopf.dev/v1", "ClusterKopfPeering", None, "fleet")]
        kube.status = {"me": _peer(100)}  # the higher peer left
        clock[0] += CHECK_SECONDS
        assert await leadership.is_active()
        kube.status = ApiError(500, "InternalError", "etcd is slow")
        clock[0] += CHECK_SECONDS
        assert await leadership.is_active()
        assert len(kube.reads) == 3

    asyncio.run(go())


def test_namespaced_operators_read_the_peering_object_of_each_watched_namespace_and_standalone_ones_none():
    kube = FakeKube({"other": _peer(50)})
    config = parse_args(["--peering=fleet", "--namespace=a", "--namespace=b"], default_instance="x")
    assert asyncio.run(Leadership(kube, config, 100, now=lambda: NOW).is_active())
    assert [(kind, ns) for _, kind, ns, _ in kube.reads] == [("KopfPeering", "a"), ("KopfPeering", "b")]
    standalone = FakeKube({"other": _peer(500)})
    assert asyncio.run(Leadership(standalone, parse_args([], default_instance="x"), 100).is_active())
    assert standalone.reads == []


def test_reconciles_that_find_the_reading_stale_together_share_one_read():
    kube = FakeKube({"me": _peer(100)})
    get = kube.get

    async def slow_get(*args):
        await asyncio.sleep(0.01)
        return await get(*args)

    kube.get = slow_get
    leadership = Leadership(kube, parse_args(["--peering=fleet"], default_instance="x"), 100, now=lambda: NOW)

    async def go():
        return await asyncio.gather(*(leadership.is_active() for _ in range(8)))

    assert asyncio.run(go()) == [True] * 8
    assert len(kube.reads) == 1
