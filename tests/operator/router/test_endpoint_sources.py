"""Where the router's endpoints come from: the static flags, and each pool's pods as a name resolves them (in a
cluster, a headless Service per pool), resolved again on an interval; what a resolver says is not trusted."""

from __future__ import annotations

import asyncio
import socket

from inferfleet_operator.router.config import EndpointSpec, PoolAddress
from inferfleet_operator.router.endpoints import MAX_ADDRESSES_PER_POOL, DnsEndpointSource, resolve

STATIC = (EndpointSpec("http://10.0.0.1:8000", "static"),)
ADDRESSES = (PoolAddress("fast", "fast.ns.svc", 8000), PoolAddress("slow", "slow.ns.svc", 9000))


class Resolver:
    def __init__(self, answers: dict):
        self.answers, self.calls = answers, 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        answer = self.answers[host]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def source(resolver: Resolver, clock: list[float]) -> DnsEndpointSource:
    return DnsEndpointSource(STATIC, ADDRESSES, 2.0, resolver, lambda: clock[0])


def urls(specs) -> list[tuple[str, str]]:
    return [(s.url, s.pool) for s in specs]


def test_each_pools_addresses_become_its_endpoints_beside_the_static_ones():
    resolver = Resolver({"fast.ns.svc": ["10.1.0.5", "10.1.0.6"], "slow.ns.svc": ["fd00::7"]})
    found = asyncio.run(source(resolver, [0.0]).endpoints())
    assert urls(found) == [
        ("http://10.0.0.1:8000", "static"),
        ("http://10.1.0.5:8000", "fast"),
        ("http://10.1.0.6:8000", "fast"),
        ("http://[fd00::7]:9000", "slow"),
    ]


def test_names_are_resolved_again_only_once_the_interval_has_passed():
    resolver = Resolver({"fast.ns.svc": ["10.1.0.5"], "slow.ns.svc": ["10.2.0.5"]})
    clock = [0.0]
    dns = source(resolver, clock)

    async def rounds():
        await dns.endpoints()
        clock[0] = 1.0
        await dns.endpoints()
        assert resolver.calls == 2  # one per pool, not again within the interval
        resolver.answers["fast.ns.svc"] = ["10.1.0.5", "10.1.0.9"]
        clock[0] = 2.5
        return await dns.endpoints()

    assert ("http://10.1.0.9:8000", "fast") in urls(asyncio.run(rounds()))
    assert resolver.calls == 4


def test_no_record_empties_the_pool_and_a_failing_resolver_keeps_its_last_answer():
    resolver = Resolver({"fast.ns.svc": ["10.1.0.5"], "slow.ns.svc": ["10.2.0.5"]})
    clock = [0.0]
    dns = source(resolver, clock)

    async def rounds():
        await dns.endpoints()
        resolver.answers["fast.ns.svc"] = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        resolver.answers["slow.ns.svc"] = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        clock[0] = 10.0
        return await dns.endpoints()

    assert urls(asyncio.run(rounds())) == [("http://10.0.0.1:8000", "static"), ("http://10.2.0.5:9000", "slow")]


def test_a_hostile_answer_gives_only_addresses_and_at_most_the_bound():
    many = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(MAX_ADDRESSES_PER_POOL + 50)]
    resolver = Resolver({"fast.ns.svc": ["evil.example/path", "10.1.0.5@x", *many], "slow.ns.svc": []})
    found = asyncio.run(source(resolver, [0.0]).endpoints())
    fast = [s for s in found if s.pool == "fast"]
    assert len(fast) == MAX_ADDRESSES_PER_POOL - 2  # the two that are no address are dropped, then the bound
    assert all(s.url.startswith("http://10.") for s in fast)


def test_the_real_resolver_finds_the_loopback_name():
    assert "127.0.0.1" in asyncio.run(resolve("localhost", 8000))


def test_an_address_that_stops_resolving_stays_a_while_for_its_pod_to_drain():
    resolver = Resolver({"fast.ns.svc": ["10.1.0.5"], "slow.ns.svc": []})
    clock = [0.0]
    dns = DnsEndpointSource(STATIC, ADDRESSES, 2.0, resolver, lambda: clock[0], keep_gone_s=8.0)

    async def at(t: float, fast: list[str]):
        clock[0], resolver.answers["fast.ns.svc"] = t, fast
        return [url for url, pool in urls(await dns.endpoints()) if pool == "fast"]

    async def rounds():
        assert await at(0.0, ["10.1.0.5"]) == ["http://10.1.0.5:8000"]
        # Replaced: the old pod left the name's answer, the new one joined; both are endpoints for a while.
        assert await at(3.0, ["10.1.0.6"]) == ["http://10.1.0.5:8000", "http://10.1.0.6:8000"]
        assert await at(11.0, ["10.1.0.6"]) == ["http://10.1.0.6:8000"]  # over 8 s since the old was last given

    asyncio.run(rounds())
