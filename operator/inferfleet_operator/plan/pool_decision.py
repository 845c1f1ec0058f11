"""decide_pool: what one pool of a service serves (paged, compiled, the previous engine, nothing) and why."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inferfleet_operator.api import conditions as c


@dataclass(frozen=True)
class PoolDecision:
    """What one pool serves, and the reason its status gives.

    engine: what the pool's Deployment runs, "Paged" | "Compiled" | "None".
    runtime: the name of the runtime whose image serves; None when nothing can serve.
    num_replicas: the pool's desiredReplicas (0 when a paged companion was needed and there is none).
    engine_key: the compiled engine served ("" unless engine is "Compiled").
    engine_build: the engine this pool wants built ("" for paged pools and pools without replicas).
    build_keys: every engine build the pool needs now: the wanted one and, while it builds, the one serving.
    """

    reason: str
    engine: str
    runtime: str | None
    num_replicas: int
    engine_key: str = ""
    engine_build: str = ""
    build_keys: tuple[str, ...] = ()
    message: str = ""

    @property
    def has_deployment(self) -> bool:
        return self.runtime is not None and self.num_replicas > 0

    @property
    def serving_engine(self) -> str:
        """status.pools[].servingEngine: what serves now ("None" without a Deployment)."""
        return self.engine if self.has_deployment else "None"


def decide_pool(
    *,
    engine: str,
    runtime: str,
    paged_runtime: str | None,
    num_replicas: int,
    capacity: int,
    capacity_message: str,
    engine_key: str,
    build_state: str,
    previous_key: str,
    previous_state: str,
    fallback: str,
    bridge: bool,
) -> PoolDecision:
    """One pool's serving decision from plain data.

    engine: the engine chosen for the pool ("Paged" | "Compiled"); runtime: the chosen runtime's name;
    paged_runtime: the runtime that can serve paged while a compiled engine is missing (None: none can).
    num_replicas: replicas assigned to the pool; capacity: how many fit it (0: none, whatever was assigned),
    capacity_message: what status says then. engine_key and build_state: the compiled engine the pool wants
    and its EngineBuild's state ("Pending" when there is none). previous_key and previous_state: the engine
    the pool's Deployment serves now ("" when none) and its build's state. fallback: spec.runtime.fallback
    ("Paged" | "None"); bridge: spec.runtime.bridge.
    """
    decision = _serving(
        engine,
        runtime,
        paged_runtime,
        num_replicas,
        engine_key,
        build_state,
        previous_key,
        previous_state,
        fallback,
        bridge,
    )
    if capacity == 0:
        return dataclasses.replace(decision, reason=c.REASON_NO_CAPACITY, message=capacity_message)
    if num_replicas == 0 and decision.reason in (c.REASON_SERVING_PAGED, c.REASON_SERVING_COMPILED):
        return dataclasses.replace(decision, reason=c.REASON_NO_REPLICAS)
    return decision


def _serving(
    engine, runtime, paged_runtime, num_replicas, key, state, previous_key, previous_state, fallback, bridge
) -> PoolDecision:
    def paged(reason: str, name: str | None, **wanted) -> PoolDecision:
        if name is None:  # a paged companion was needed and there is none: nothing serves
            return PoolDecision(reason, "None", None, 0, **wanted)
        return PoolDecision(reason, "Paged", name, num_replicas, **wanted)

    if engine == "Paged":
        return paged(c.REASON_SERVING_PAGED, runtime)
    if num_replicas == 0:
        # No build for a pool that serves nothing: it would hold GPUs other pools' replicas may need.
        return PoolDecision(c.REASON_NO_REPLICAS, "None", None, 0)
    wanted = {"engine_build": key, "build_keys": (key,)}
    if state == "Ready":
        return PoolDecision(c.REASON_SERVING_COMPILED, "Compiled", runtime, num_replicas, key, **wanted)
    if previous_key and previous_key != key and previous_state == "Ready":
        # Envelope (or image) changed: the previous engine serves until the new one is Ready.
        return PoolDecision(
            c.REASON_SERVING_PREVIOUS_ENGINE, "Compiled", runtime, num_replicas, previous_key, key, (key, previous_key)
        )
    if state == "Failed":
        if fallback == "Paged":
            return paged(c.REASON_FALLBACK_PAGED, paged_runtime, **wanted)
        return PoolDecision(c.REASON_BUILD_FAILED_NO_FALLBACK, "None", None, num_replicas, **wanted)
    if bridge:
        return paged(c.REASON_BRIDGING, paged_runtime, **wanted)
    return PoolDecision(c.REASON_WAITING_FOR_BUILD, "None", None, num_replicas, **wanted)
