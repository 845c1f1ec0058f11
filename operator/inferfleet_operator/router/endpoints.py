"""Where the router's endpoints come from (EndpointSource) and what it knows of each (EndpointTable)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferfleet_operator.plan.endpoint_picker import Endpoint, EndpointMetrics
from inferfleet_operator.router.config import EndpointSpec, PoolAddress, RouterConfig
from inferfleet_operator.router.profiles import PoolProfiles

MAX_ADDRESSES_PER_POOL = 1024  # a DNS answer is not trusted to be small
# getaddrinfo's "no such name" answers: a headless Service with no ready pod has no record at all.
_NO_RECORD = frozenset(getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name))

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]


class EndpointSource(Protocol):
    """The serving pods to route over, asked once per scrape round: StaticEndpointSource holds the --endpoint flags,
    DnsEndpointSource adds the pods behind each --pool-address (in a cluster: one headless Service per pool, whose
    DNS name resolves to that pool's ready pods)."""

    async def endpoints(self) -> Sequence[EndpointSpec]: ...


@dataclass(frozen=True)
class StaticEndpointSource:
    specs: tuple[EndpointSpec, ...]

    async def endpoints(self) -> Sequence[EndpointSpec]:
        return self.specs


async def resolve(host: str, port: int) -> list[str]:
    """The addresses host resolves to (IPv4 and IPv6, each once, in the resolver's order)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class DnsEndpointSource:
    """The static endpoints and, per pool address, one endpoint per address its host resolves to, resolved again
    once resolve_interval_s has passed. A name with no record means the pool has no ready pod; any other resolver
    failure keeps the pool's last answer (the scraper still checks each pod). An address no longer in the answer
    stays keep_gone_s: a pod being replaced still serves through its preStop wait while its successor is found."""

    def __init__(
        self,
        static: Sequence[EndpointSpec],
        addresses: Sequence[PoolAddress],
        interval_s: float,
        resolver: Resolver = resolve,
        clock: Callable[[], float] = time.monotonic,
        keep_gone_s: float = 0.0,
    ) -> None:
        self.static, self.addresses, self.interval_s = tuple(static), tuple(addresses), interval_s
        self._resolver, self._clock, self._keep_gone_s = resolver, clock, keep_gone_s
        self._seen: dict[str, dict[EndpointSpec, float]] = {}  # pool -> endpoint -> when its name last gave it
        self._resolved_at: float | None = None

    async def endpoints(self) -> Sequence[EndpointSpec]:
        now = self._clock()
        if self._resolved_at is None or now - self._resolved_at >= self.interval_s:
            self._resolved_at = now
            answers = await asyncio.gather(*(self._resolve(a) for a in self.addresses))
            for address, found in zip(self.addresses, answers):
                if found is None:  # the resolver failed: the last answer stands
                    continue
                seen = self._seen.setdefault(address.pool, {})
                seen.update(dict.fromkeys(found, now))
                for spec in [s for s, at in seen.items() if now - at > self._keep_gone_s]:
                    del seen[spec]
        return self.static + tuple(spec for a in self.addresses for spec in self._seen.get(a.pool, {}))

    async def _resolve(self, address: PoolAddress) -> tuple[EndpointSpec, ...] | None:
        """The pool's endpoints now; None when the resolver failed without saying there is no record."""
        try:
            hosts = await self._resolver(address.host, address.port)
        except socket.gaierror as error:
            if error.errno in _NO_RECORD:
                return ()
            log.warning("Failed to resolve %s (pool %s): %s", address.host, address.pool, error)
            return None
        except OSError as error:
            log.warning("Failed to resolve %s (pool %s): %s", address.host, address.pool, error)
            return None
        specs = []
        for host in hosts[:MAX_ADDRESSES_PER_POOL]:
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:  # a resolver answers addresses; anything else is dropped
                continue
            netloc = f"[{ip}]" if ip.version == 6 else str(ip)
            specs.append(EndpointSpec(f"http://{netloc}:{address.port}", address.pool))
        if len(hosts) > MAX_ADDRESSES_PER_POOL:
            log.warning("%s resolves to %d addresses; routing over the first %d", address.host, len(hosts), len(specs))
        return tuple(specs)


def source_for(config: RouterConfig) -> EndpointSource:
    if not config.pool_addresses:
        return StaticEndpointSource(config.endpoints)
    return DnsEndpointSource(
        config.endpoints, config.pool_addresses, config.resolve_interval_s, keep_gone_s=config.keep_gone_s
    )


@dataclass
class EndpointState:
    spec: EndpointSpec
    is_ready: bool = False  # the last /ready answered 200, and no request failed to connect since
    metrics: EndpointMetrics | None = None  # None: /metrics never answered
    generated: tuple[float, float] | None = None  # (scraped at, the pod's output tokens so far) of the last scrape
    is_profile_asked: bool = False  # its /profile was read (once: a pod is ready only after it measured)


class EndpointTable:
    """Every endpoint's state, and the picker's view of them (frozen Endpoints, rebuilt when a state changes)."""

    def __init__(self, profiles: PoolProfiles) -> None:
        self.profiles = profiles
        self._states: dict[str, EndpointState] = {}
        self._view: tuple[Endpoint, ...] = ()

    def sync(self, specs: Sequence[EndpointSpec]) -> None:
        """Adds the endpoints new in specs (unready, never scraped) and forgets those gone from it."""
        wanted = {spec.url: spec for spec in specs}
        for url in [url for url, state in self._states.items() if wanted.get(url) != state.spec]:
            del self._states[url]
        for url, spec in wanted.items():
            if url not in self._states:
                self._states[url] = EndpointState(spec)
        self._rebuild()

    def states(self) -> list[EndpointState]:
        return list(self._states.values())

    def get(self, url: str) -> EndpointState | None:
        return self._states.get(url)

    def update(
        self, url: str, is_ready: bool, metrics: EndpointMetrics | None, generated: tuple[float, float] | None
    ) -> None:
        state = self._states.get(url)
        if state is None:  # removed while its scrape ran
            return
        state.is_ready = is_ready
        if metrics is not None:  # a failed scrape keeps the last metrics: they age until the picker ignores them
            state.metrics, state.generated = metrics, generated
            self.profiles.observe(state.spec.pool, metrics)
        self._rebuild()

    def record_profile(self, pool: str, profile) -> None:
        """A pod's measured profile becomes its pool's; every endpoint of the pool sees it."""
        self.profiles.record_measured(pool, profile)
        self._rebuild()

    def mark_down(self, url: str) -> None:
        """Not picked until a scrape finds it ready again (a connection to it failed)."""
        state = self._states.get(url)
        if state is not None and state.is_ready:
            state.is_ready = False
            self._rebuild()

    def endpoints(self) -> tuple[Endpoint, ...]:
        """The picker's view: every endpoint (the picker itself skips the unready and never scraped)."""
        return self._view

    def pickable(self) -> tuple[Endpoint, ...]:
        return tuple(e for e in self._view if e.is_ready and e.metrics is not None)

    def _rebuild(self) -> None:
        profile_for = self.profiles.profile_for
        self._view = tuple(
            Endpoint(s.spec.url, s.spec.pool, profile_for(s.spec.pool), s.is_ready, s.metrics)
            for s in self._states.values()
        )
