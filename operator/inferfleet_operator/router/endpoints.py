"""Where the router's endpoints come from (EndpointSource) and what it knows of each (EndpointTable)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from inferfleet_operator.plan.endpoint_picker import Endpoint, EndpointMetrics
from inferfleet_operator.router.config import EndpointSpec
from inferfleet_operator.router.profiles import PoolProfiles


class EndpointSource(Protocol):
    """The serving pods to route over, asked once per scrape round. StaticEndpointSource holds the --endpoint flags;
    one that watches a service's EndpointSlices is the seam for running in a cluster (not written yet)."""

    def endpoints(self) -> Sequence[EndpointSpec]: ...


@dataclass(frozen=True)
class StaticEndpointSource:
    specs: tuple[EndpointSpec, ...]

    def endpoints(self) -> Sequence[EndpointSpec]:
        return self.specs


@dataclass
class EndpointState:
    spec: EndpointSpec
    is_ready: bool = False  # the last /ready answered 200, and no request failed to connect since
    metrics: EndpointMetrics | None = None  # None: /metrics never answered
    generated: tuple[float, float] | None = None  # (scraped at, the pod's output tokens so far) of the last scrape


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
