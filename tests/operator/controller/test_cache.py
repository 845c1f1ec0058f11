"""ReadCache: own writes shadow the index until the watch catches up; the cluster view is rebuilt on change."""

from __future__ import annotations

from planning_data import RUNTIMES, h100

from inferfleet_operator.controller import cache as c
from inferfleet_operator.controller.cache import ReadCache


def deployment(rv: int) -> dict:
    return {"kind": "Deployment", "metadata": {"name": "d", "namespace": "ns", "resourceVersion": str(rv)}}


def test_a_write_shadows_an_older_indexed_object_until_the_watch_delivers_it():
    cache = ReadCache({})
    cache.remember(deployment(5))
    assert cache.fresher("Deployment", deployment(4), "ns", "d")["metadata"]["resourceVersion"] == "5"
    cache.observed("Deployment", deployment(4))
    assert ("Deployment", "ns", "d") in cache.written  # an older event does not clear it
    cache.observed("Deployment", deployment(5))
    assert cache.written == {}
    assert cache.fresher("Deployment", deployment(5), "ns", "d") == deployment(5)


def test_a_deleted_object_is_forgotten_whatever_its_version():
    cache = ReadCache({})
    cache.remember(deployment(9))
    cache.observed("Deployment", deployment(1), is_deleted=True)
    assert cache.written == {}


def test_the_cluster_view_is_rebuilt_only_after_a_change():
    indices = {c.NODES: {"n": [h100("n")]}, c.RUNTIMES: {r["metadata"]["name"]: [r] for r in RUNTIMES}}
    cache = ReadCache(indices)
    first = cache.cluster_view()
    assert cache.cluster_view() is first
    cache.cluster_changed()
    assert cache.cluster_view() is not first and cache.cluster_view() == first


def test_claims_are_unknown_unless_watched():
    assert ReadCache({}).claims("ns") is None
    assert ReadCache({c.CLAIMS: {"ns": ["models"]}}).claims("ns") == frozenset({"models"})


def test_an_event_is_an_echo_only_when_it_is_exactly_the_objects_own_last_write():
    cache = ReadCache({})
    assert not cache.observed("Deployment", deployment(3))  # nothing written: someone else's change
    cache.remember(deployment(5))
    assert not cache.observed("Deployment", deployment(4))  # older than the write
    assert cache.observed("Deployment", deployment(5))  # the write itself coming back
    assert not cache.observed("Deployment", deployment(5))  # once only: the memo of the write is gone
    cache.remember(deployment(7))
    assert not cache.observed("Deployment", deployment(8))  # a newer change on top of the write
    cache.remember(deployment(9))
    assert not cache.observed("Deployment", deployment(9), is_deleted=True)
