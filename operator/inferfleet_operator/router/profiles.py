"""PoolProfiles: each pool's profile, from the profile file, else as its pods measured it (serve --calibrate, read
from the first pod of the pool that answers /profile), else the conservative default scaled by the output rates its
pods were observed at (so every pod of the pool shares one learned speed)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from inferfleet_operator.plan.endpoint_picker import EndpointMetrics, PoolProfile
from inferfleet_operator.router.config import DEFAULT_PROFILE

LEARNING_WEIGHT = 0.3  # weight of one observation in the pool's learned factor (a geometric moving average)
FACTOR_RANGE = (1e-3, 1e5)  # the default scaled at most this far: from a tenth of a token/s to a million
REBUILD_CHANGE = 0.05  # the learned profile is rebuilt when the factor moved more than this fraction


def scaled(profile: PoolProfile, factor: float) -> PoolProfile:
    """The profile with every prefill and decode rate times factor."""
    return PoolProfile(
        tuple((x, y * factor) for x, y in profile.prefill),
        tuple((x, y * factor) for x, y in profile.decode),
        profile.max_batch,
        profile.kv_capacity_tokens,
        profile.block_size,
        profile.has_prefix_cache,
    )


def observed_factor(profile: PoolProfile, metrics: EndpointMetrics) -> float | None:
    """The observed output rate over the profile's at the batch it was observed at; None when nothing ran."""
    if metrics.observed_tokens_per_s is None or metrics.num_running < 1:
        return None
    ratio = metrics.observed_tokens_per_s / profile.decode_rate(min(profile.max_batch, metrics.num_running))
    return min(max(ratio, FACTOR_RANGE[0]), FACTOR_RANGE[1])


class PoolProfiles:
    def __init__(self, configured: Mapping[str, PoolProfile], default: PoolProfile = DEFAULT_PROFILE) -> None:
        self._configured = dict(configured)
        self._measured: dict[str, PoolProfile] = {}  # by pool, from a pod's /profile
        self._default = default
        self._factors: dict[str, float] = {}  # learned, by profile-less pool
        self._learned: dict[str, tuple[float, PoolProfile]] = {}  # (the factor it was built from, the profile)

    def profile_for(self, pool: str) -> PoolProfile:
        if pool in self._configured:
            return self._configured[pool]
        if pool in self._measured:
            return self._measured[pool]
        learned = self._learned.get(pool)
        return learned[1] if learned is not None else self._default

    def source(self, pool: str) -> str:
        """Where the pool's profile comes from: file, measured, learned or default."""
        if pool in self._configured or pool in self._measured:
            return "file" if pool in self._configured else "measured"
        return "learned" if pool in self._learned else "default"

    def is_learned(self, pool: str) -> bool:
        return pool not in self._configured and pool not in self._measured

    def needs_measured(self, pool: str) -> bool:
        """Whether a pod of this pool should be asked for its measured profile."""
        return self.is_learned(pool)

    def record_measured(self, pool: str, profile: PoolProfile) -> None:
        """The profile a pod of the pool measured; from now on the pool's (a profile file's entry still wins)."""
        self._measured[pool] = profile

    def observe(self, pool: str, metrics: EndpointMetrics) -> bool:
        """Learns from one scrape of a pod of a profile-less pool; whether the pool's profile changed."""
        if not self.is_learned(pool):
            return False
        ratio = observed_factor(self._default, metrics)
        if ratio is None:
            return False
        previous = self._factors.get(pool)
        factor = (
            ratio
            if previous is None
            else math.exp((1 - LEARNING_WEIGHT) * math.log(previous) + LEARNING_WEIGHT * math.log(ratio))
        )
        self._factors[pool] = factor
        built = self._learned.get(pool)
        if built is not None and abs(factor / built[0] - 1) <= REBUILD_CHANGE:
            return False
        self._learned[pool] = (factor, scaled(self._default, factor))
        return True
