"""Request arrival times: a Poisson process (burstiness 1) or gamma-distributed gaps (burstiness != 1).

Gaps have mean 1 / request_rate either way; burstiness is the gamma shape, so the gaps' coefficient of
variation is 1 / sqrt(burstiness): below 1 burstier than Poisson, above 1 more regular.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the start at which each request is sent (non-decreasing; all 0 for an infinite rate)."""
    if request_rate <= 0:
        raise ValueError(f"request rate must be positive, got {request_rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    gaps[0] = 0.0  # the first request goes at once
    return np.cumsum(gaps).tolist()
