"""EventRecorder: posts the operator's Events, each at most once, so a replayed plan posts nothing new."""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from inferfleet_operator.kube.client import ApiError, Kube

logger = logging.getLogger("inferfleet_operator")

MAX_REMEMBERED = 10_000  # Events remembered as posted; the oldest are forgotten first


def object_ref(obj: Mapping) -> str:
    """ "namespace/name", or "name" for a cluster-scoped object."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class EventRecorder:
    def __init__(self, kube: Kube):
        self._kube = kube
        self._posted: collections.OrderedDict[tuple, None] = collections.OrderedDict()

    async def post(self, obj: dict, events: Iterable[Any], action: str) -> None:
        """Posts each of `events` (conditions.PlannedEvent) about `obj` unless it was posted before."""
        for event in events:
            key = (obj["metadata"].get("uid"), event.type, event.reason, event.message)
            if key in self._posted:
                continue
            self._posted[key] = None
            while len(self._posted) > MAX_REMEMBERED:
                self._posted.popitem(last=False)
            try:
                await self._kube.post_event(
                    obj, type=event.type, reason=event.reason, note=event.message, action=action
                )
            except ApiError as error:  # Events are best effort: never worth a failed reconcile
                logger.warning(
                    "Failed to post Event %s about %s %s: %s", event.reason, obj["kind"], object_ref(obj), error
                )
