"""Whether this replica is the active one under kopf peering (--peering), for the work queue's own requeues.

kopf pauses its watches while a live peer has a higher priority, so the handlers see nothing; but the work
queue's resync (handlers._work) and a reconcile's requeue come from inside the process and would go on. A
paused replica must not reconcile from indexes that no longer move, so _work asks here first. The rule is
kopf's (kopf/_core/engines/peering.py): paused while a live peer in the peering object's status has a higher
priority; a peer is live until its `lastseen` plus its `lifetime`. A peer of the same priority cannot be told
apart from this process (kopf's identity of the process is its own), so a tie counts as active here; kopf
pauses both replicas of a tie, and then only requeues could run (the default priorities are random).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from inferfleet_operator.api.names import KINDS
from inferfleet_operator.controller.settings import OperatorConfig
from inferfleet_operator.kube.client import ApiError, Kube

logger = logging.getLogger("inferfleet_operator")

CHECK_SECONDS = 5.0  # the peering object is read again after this long


def is_paused(status: Mapping[str, Any] | None, own_priority: int, now: datetime.datetime) -> bool:
    """Whether a peering object's status (identity -> priority, lifetime, lastseen) pauses a replica of
    `own_priority` at `now`."""
    for peer in (status or {}).values():
        try:
            priority = int(peer.get("priority", 0))
            deadline = datetime.datetime.fromisoformat(peer["lastseen"]) + datetime.timedelta(
                seconds=int(peer.get("lifetime", 60))
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # not a peer entry kopf wrote
        if priority > own_priority and deadline > now:
            return True
    return False


class Leadership:
    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        priority: int,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ):
        self._kube, self._config, self._priority = kube, config, priority
        self._monotonic, self._now = monotonic, now
        self._checked: tuple[float, bool] | None = None
        # One read at a time: the reconciles that find the reading stale together wait for one GET.
        self._reading = asyncio.Lock()

    def _peering_objects(self) -> list[tuple[str, str | None]]:
        """(kind, namespace) of the peering objects kopf elects through: one cluster-wide, or one per
        watched namespace (patterns left out: kopf matches them against the cluster's namespaces)."""
        if self._config.is_clusterwide:
            return [("ClusterKopfPeering", None)]
        return [("KopfPeering", ns) for ns in self._config.namespaces if ns.replace("-", "").isalnum()]

    def _fresh(self) -> bool | None:
        if self._checked is not None and self._monotonic() - self._checked[0] < CHECK_SECONDS:
            return self._checked[1]
        return None

    async def is_active(self) -> bool:
        if self._config.peering is None:
            return True
        if (known := self._fresh()) is not None:
            return known
        async with self._reading:
            if (known := self._fresh()) is not None:  # read by another reconcile while this one waited
                return known
            return await self._read()

    async def _read(self) -> bool:
        at = self._monotonic()
        was_active = True if self._checked is None else self._checked[1]
        try:
            peerings = [
                await self._kube.get(KINDS[kind].api_version, kind, namespace, self._config.peering)
                for kind, namespace in self._peering_objects()
            ]
        except (ApiError, OSError, TimeoutError, aiohttp.ClientError) as error:  # keep what was known
            logger.warning("Failed to read the peering object %s: %s", self._config.peering, error)
            self._checked = (at, was_active)
            return was_active
        now = self._now()
        active = not any(is_paused((p or {}).get("status"), self._priority, now) for p in peerings)
        if active != was_active:
            logger.info("%s reconciles (peering %s)", "Resumed" if active else "Paused", self._config.peering)
        self._checked = (at, active)
        return active
