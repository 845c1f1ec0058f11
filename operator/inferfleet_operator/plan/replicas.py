"""distribute: a service's total replicas across its serving pools, by capacity, honouring per-pool overrides."""

from __future__ import annotations

from dataclasses import dataclass

from inferfleet_operator.api.quantity import to_millis
from inferfleet_operator.plan.pools import Pool


@dataclass(frozen=True)
class Distribution:
    replicas: dict[str, int]  # pool name -> replicas (every pool given appears, possibly with 0)
    num_unplaced: int  # replicas asked for that no pool has room for


def pool_capacity(pool: Pool, gpus_per_replica: int, cpu_request: str) -> int:
    """How many replicas of one service fit the pool alone: a replica never spans nodes. GPU pools count
    whole GPUs per node; cpu pools count the CPU request against each node's allocatable CPU. This is the
    pool's size, not its free room: other services share the nodes and the scheduler queues what does not fit."""
    if pool.vendor == "cpu":
        request = max(to_millis(cpu_request), 1)
        return sum(millis // request for millis in pool.node_cpu_millis)
    return sum(gpus // gpus_per_replica for gpus in pool.node_gpus)


def _split(remaining: int, free: dict[str, int]) -> dict[str, int]:
    """`remaining` over `free` (name -> capacity > 0) in proportion to capacity, largest remainder, ties by
    name; every pool gets at most its capacity."""
    cap_total = sum(free.values())
    if remaining >= cap_total:
        return dict(free)
    shares = {n: remaining * c // cap_total for n, c in free.items()}
    left = remaining - sum(shares.values())
    by_remainder = sorted(free, key=lambda n: (-(remaining * free[n] % cap_total), n))
    for name in by_remainder[:left]:
        shares[name] += 1
    return shares


def distribute(
    total: int, capacities: dict[str, int], overrides: dict[str, int], tiers: dict[str, int] | None = None
) -> Distribution:
    """Overridden pools get their override; the rest of `total` goes to the other pools tier by tier (lowest
    tier number first; a pool missing from `tiers` is tier 0): a tier is filled up to its capacity, split in
    proportion to capacity (largest remainder, ties by name), before the next tier gets any. No pool gets
    more than its capacity, so a pool without capacity gets none. Deterministic: depends only on the
    arguments, not on dict order."""
    tiers = tiers or {}
    result = {name: 0 for name in capacities}
    num_unplaced = 0
    for name, wanted in overrides.items():
        if name in capacities:
            result[name] = min(wanted, capacities[name])
            num_unplaced += wanted - result[name]
    remaining = max(0, total - sum(overrides.get(n, 0) for n in capacities if n in overrides))
    free = {n: c for n, c in sorted(capacities.items()) if n not in overrides and c > 0}
    for tier in sorted({tiers.get(n, 0) for n in free}):
        shares = _split(remaining, {n: c for n, c in free.items() if tiers.get(n, 0) == tier})
        result.update(shares)
        remaining -= sum(shares.values())
    return Distribution(result, num_unplaced + remaining)
