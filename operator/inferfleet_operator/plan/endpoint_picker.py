"""endpoint_picker: the serving pod of a mixed-vendor service that is predicted to finish a request soonest."""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

REASON_LEAST_FINISH = "LeastPredictedFinish"
REASON_PREFIX_AFFINITY = "PrefixAffinity"  # the prefix's home endpoint, within the load bound
REASON_PREFIX_SPILLOVER = "PrefixSpillover"  # the home was over the load bound: the least predicted finish
REASON_NO_ENDPOINTS = "NoEndpoints"
REASON_NONE_READY = "NoReadyEndpoint"  # unready, never scraped, or silent past unreachable_after_s
REASON_NONE_FITS = "NoEndpointFits"  # prompt + output exceed every ready endpoint's KV capacity

MAX_TOKENS = 1e9  # reported work is clamped to this; NaN reads as this (a broken exporter draws no traffic)
MAX_REQUESTS = 1e6
MAX_RATE = 1e9  # tokens/s
OBSERVED_WEIGHT = 0.5  # weight of a pod's observed token rate against its pool profile
MAX_RATE_RATIO = 4.0  # observed / profile rate is clamped into [1/ratio, ratio] before blending
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class PickerSettings:
    stale_after_s: float = 2.0  # older metrics: reported load ignored, in-picker accounting alone
    unreachable_after_s: float = 30.0  # older metrics: never picked (the pod stopped answering)
    load_epsilon: float = 0.25  # bounded load: a prefix's home is used while its load <= (1 + eps) x mean
    num_prefix_blocks: int = 4  # the prefix key hashes up to this many full KV blocks of the prompt


DEFAULT_SETTINGS = PickerSettings()


def _clamped(value: float, high: float, nan: float) -> float:
    value = float(value)
    if math.isnan(value):
        return nan
    return min(max(value, 0.0), high)


def _interpolate(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the points, flat beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x)
    x0, y0 = xs[i - 1], ys[i - 1]
    return y0 + (ys[i] - y0) * (x - x0) / (xs[i] - x0)


def _points(name: str, points: Sequence[tuple[float, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    ordered = sorted((float(x), float(y)) for x, y in points)
    xs, ys = tuple(x for x, _ in ordered), tuple(y for _, y in ordered)
    if not ordered or len(set(xs)) != len(xs):
        raise ValueError(f"{name} needs at least one point and distinct x values, got {list(points)}")
    if not all(math.isfinite(x) and x > 0 for x in xs) or not all(math.isfinite(y) and y > 0 for y in ys):
        raise ValueError(f"{name} points must be finite and positive, got {list(points)}")
    return xs, ys


@dataclass(frozen=True, slots=True)
class PoolProfile:
    """Measured service rates of one pool's engine (one vendor, product and engine kind)."""

    prefill: tuple[tuple[int, float], ...]  # (prompt length, prefill tokens/s)
    decode: tuple[tuple[int, float], ...]  # (batch size, decode tokens/s summed over the batch)
    max_batch: int
    kv_capacity_tokens: int
    block_size: int
    has_prefix_cache: bool
    _prefill_xs: tuple = field(init=False, repr=False, compare=False)
    _prefill_ys: tuple = field(init=False, repr=False, compare=False)
    _decode_xs: tuple = field(init=False, repr=False, compare=False)
    _decode_ys: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        xs, ys = _points("prefill", self.prefill)
        object.__setattr__(self, "_prefill_xs", xs)
        object.__setattr__(self, "_prefill_ys", ys)
        xs, ys = _points("decode", self.decode)
        object.__setattr__(self, "_decode_xs", xs)
        object.__setattr__(self, "_decode_ys", ys)
        if min(self.max_batch, self.kv_capacity_tokens, self.block_size) < 1:
            raise ValueError("max_batch, kv_capacity_tokens and block_size must be at least 1")

    def prefill_rate(self, num_prompt_tokens: float) -> float:
        return _interpolate(self._prefill_xs, self._prefill_ys, num_prompt_tokens)

    def decode_rate(self, batch: float) -> float:
        return _interpolate(self._decode_xs, self._decode_ys, batch)


PROFILE_FIELDS = ("prefill", "decode", "max_batch", "kv_capacity_tokens", "block_size", "has_prefix_cache")


def profile_from_json(value) -> PoolProfile:
    """A PoolProfile from its JSON value, every field required and checked (a profile file's entry, or what a pod
    serves at /profile: untrusted); ValueError naming the field."""
    if not isinstance(value, dict):
        raise ValueError(f"expected an object with {', '.join(PROFILE_FIELDS)}")
    missing = [name for name in PROFILE_FIELDS if name not in value]
    unknown = sorted(set(value) - set(PROFILE_FIELDS))
    if missing or unknown:
        raise ValueError(f"missing {missing}, unknown {unknown}")
    for name in ("prefill", "decode"):
        points = value[name]
        if not isinstance(points, list) or not all(_is_json_point(p) for p in points):
            raise ValueError(f"{name} must be a list of [x, tokens per second] pairs of numbers")
    for name in ("max_batch", "kv_capacity_tokens", "block_size"):
        if type(value[name]) is not int:
            raise ValueError(f"{name} must be an integer")
    if type(value["has_prefix_cache"]) is not bool:
        raise ValueError("has_prefix_cache must be true or false")
    return PoolProfile(
        tuple(tuple(p) for p in value["prefill"]),
        tuple(tuple(p) for p in value["decode"]),
        value["max_batch"],
        value["kv_capacity_tokens"],
        value["block_size"],
        value["has_prefix_cache"],
    )


def _is_json_point(point) -> bool:
    return (
        isinstance(point, list) and len(point) == 2 and all(type(x) in (int, float) and math.isfinite(x) for x in point)
    )


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """One scrape of a serving pod. Values are clamped on construction: negative to 0, huge to a bound, NaN to the
    pessimistic end, so a broken or hostile exporter cannot crash the picker or look emptier than an idle pod."""

    scraped_at: float  # seconds, the clock of `now`
    num_queued_prompt_tokens: float = 0.0  # prompt tokens of waiting requests (work at the prefill rate)
    num_queued_output_tokens: float = 0.0  # expected output tokens of waiting requests (at the decode rate)
    num_running_tokens: float = 0.0  # expected output tokens still to generate for running requests
    num_running: float = 0.0  # sequences in the batch
    num_waiting: float = 0.0
    kv_utilisation: float = 0.0  # fraction of KV blocks in use, 0..1
    observed_tokens_per_s: float | None = None  # output tokens/s measured over the last window; None: unknown

    def __post_init__(self) -> None:
        put = object.__setattr__
        scraped_at = float(self.scraped_at)
        put(self, "scraped_at", scraped_at if math.isfinite(scraped_at) else -math.inf)
        put(self, "num_queued_prompt_tokens", _clamped(self.num_queued_prompt_tokens, MAX_TOKENS, MAX_TOKENS))
        put(self, "num_queued_output_tokens", _clamped(self.num_queued_output_tokens, MAX_TOKENS, MAX_TOKENS))
        put(self, "num_running_tokens", _clamped(self.num_running_tokens, MAX_TOKENS, MAX_TOKENS))
        put(self, "num_running", _clamped(self.num_running, MAX_REQUESTS, MAX_REQUESTS))
        put(self, "num_waiting", _clamped(self.num_waiting, MAX_REQUESTS, MAX_REQUESTS))
        put(self, "kv_utilisation", _clamped(self.kv_utilisation, 1.0, 1.0))
        rate = self.observed_tokens_per_s
        if rate is not None:
            rate = _clamped(rate, MAX_RATE, 0.0)
            put(self, "observed_tokens_per_s", rate if rate > 0 else None)


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str  # pod ip:port
    pool: str
    profile: PoolProfile
    is_ready: bool
    metrics: EndpointMetrics | None  # None: the metrics endpoint never answered
    key: int = field(init=False, repr=False, compare=False)  # stable 64-bit hash of the address
    speed: float = field(init=False, repr=False, compare=False)  # profile rates x this, from the observed rate

    def __post_init__(self) -> None:
        digest = hashlib.blake2b(self.address.encode(), digest_size=8).digest()
        object.__setattr__(self, "key", int.from_bytes(digest, "little"))
        object.__setattr__(self, "speed", observed_speed(self.profile, self.metrics))


def observed_speed(profile: PoolProfile, metrics: EndpointMetrics | None) -> float:
    """The pod's observed output rate against its profile at the batch it was observed over, blended with 1.
    1 when nothing was observed or nothing ran (an idle pod's rate says nothing about its speed)."""
    if metrics is None or metrics.observed_tokens_per_s is None or metrics.num_running < 1:
        return 1.0
    ratio = metrics.observed_tokens_per_s / profile.decode_rate(min(profile.max_batch, metrics.num_running))
    ratio = min(max(ratio, 1 / MAX_RATE_RATIO), MAX_RATE_RATIO)
    return 1 + OBSERVED_WEIGHT * (ratio - 1)


@dataclass(frozen=True, slots=True)
class PickRequest:
    num_prompt_tokens: int
    num_output_tokens: int  # expected: the request's max_tokens or the service's typical length
    prefix_token_ids: tuple[int, ...] = ()  # the prompt's first token ids (up to num_prefix_blocks blocks); () none

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_prompt_tokens", max(0, int(self.num_prompt_tokens)))
        object.__setattr__(self, "num_output_tokens", max(1, int(self.num_output_tokens)))


@dataclass(frozen=True, slots=True)
class SentWork:
    """What the picker sent one endpoint: work it cannot have finished yet at its rates, and the sends after the
    endpoint's last metrics (which that scrape could not count)."""

    num_prompt_tokens: float = 0.0
    num_output_tokens: float = 0.0
    num_requests: float = 0.0
    updated_at: float = 0.0
    recent: tuple[tuple[float, int, int], ...] = ()  # (sent at, prompt tokens, output tokens), oldest first


@dataclass(frozen=True, slots=True)
class Decision:
    endpoint: Endpoint | None
    reason: str
    predicted_s: float | None = None  # predicted time to finish the request on that endpoint
    is_metrics_stale: bool = False  # the endpoint's metrics were stale: in-picker accounting alone


class _Load(NamedTuple):
    """One endpoint's state as the picker believes it at `now` (a tuple: built once per endpoint per decision)."""

    rate: float  # aggregate decode tokens/s at the batch it would run this request in
    ahead_s: float  # the work ahead of the request: prompts at the prefill rate, outputs at `rate`
    num_requests: float  # in flight, before this request
    num_free_kv_tokens: float
    is_stale: bool
    sent: tuple[float, float, float]  # the picker's accounting drained to `now`: prompt, output tokens, requests


def _load(
    endpoint: Endpoint, sent: SentWork | None, now: float, prefill_rate: float, settings: PickerSettings
) -> _Load:
    """Reported load, plus what the picker sent since the scrape, and never below what it sent and the endpoint
    cannot have finished yet at its (observed) rates: a pod that reports an empty queue gets no more credit."""
    profile, metrics = endpoint.profile, endpoint.metrics
    assert metrics is not None
    scraped_at = metrics.scraped_at if metrics.scraped_at < now else now  # the scraper's clock may run ahead
    is_stale = now - scraped_at > settings.stale_after_s
    prompt = output = num_requests = recent_tokens = 0.0
    if not is_stale:
        prompt = metrics.num_queued_prompt_tokens
        output = metrics.num_queued_output_tokens + metrics.num_running_tokens
        num_requests = metrics.num_running + metrics.num_waiting
    sent_prompt = sent_output = sent_requests = 0.0
    if sent is not None:
        sent_prompt, sent_output, sent_requests = sent.num_prompt_tokens, sent.num_output_tokens, sent.num_requests
        for sent_at, num_prompt, num_output in () if is_stale else sent.recent:
            if sent_at >= scraped_at:  # a send at the scrape instant may be missing from it
                prompt += num_prompt
                output += num_output
                num_requests += 1
                recent_tokens += num_prompt + num_output
    max_batch = profile.max_batch
    busiest = num_requests if num_requests > sent_requests else sent_requests  # undrained: the drain errs slow
    rate = _interpolate(profile._decode_xs, profile._decode_ys, busiest + 1 if busiest < max_batch else max_batch)
    if not is_stale:
        rate *= endpoint.speed
    ahead_s = prompt / prefill_rate + output / rate
    if sent_requests > 0:
        sent_s = sent_prompt / prefill_rate + sent_output / rate
        left = 1.0 - (now - sent.updated_at) / sent_s if sent_s > 0 else 0.0
        left = 0.0 if left < 0 else 1.0 if left > 1 else left
        sent_prompt *= left
        sent_output *= left
        sent_requests *= left
        sent_s *= left
        if sent_s > ahead_s:
            ahead_s = sent_s
        if sent_requests > num_requests:
            num_requests = sent_requests
    if is_stale:
        num_free_kv = profile.kv_capacity_tokens - sent_prompt - sent_output
    else:
        num_free_kv = profile.kv_capacity_tokens * (1 - metrics.kv_utilisation) - recent_tokens
    # tuple.__new__ skips the named tuple's Python-level __new__ (this runs once per endpoint per decision).
    return tuple.__new__(
        _Load, (rate, ahead_s, num_requests, num_free_kv, is_stale, (sent_prompt, sent_output, sent_requests))
    )


def _prefill_rate(request: PickRequest, profile: PoolProfile) -> float:
    return profile.prefill_rate(request.num_prompt_tokens)


def predict_finish(
    request: PickRequest,
    endpoint: Endpoint,
    now: float,
    sent: SentWork | None = None,
    settings: PickerSettings = DEFAULT_SETTINGS,
) -> float | None:
    """Seconds until the request would finish on the endpoint; None when it can never fit in its KV cache."""
    prefill_rate = _prefill_rate(request, endpoint.profile)
    load = _load(endpoint, sent, now, prefill_rate, settings)
    return _finish(request, endpoint.profile, load, request.num_prompt_tokens / prefill_rate)


def _finish(request: PickRequest, profile: PoolProfile, load: _Load, prefill_s: float) -> float | None:
    """The prompt's prefill at the profile's rate for its length, the work ahead (prompts at that prefill rate,
    outputs at the aggregate decode rate of the batch the request would join) and the request's own output at that
    rate: least work left, in seconds. Plus waiting for a slot when the batch is full and for KV space when the
    request does not fit. (Charging the request's output at its slot's share of the batch instead, a closer
    latency for one request, left the slow pools idle longer and lost throughput and TTFT in pickbench.)"""
    num_tokens = request.num_prompt_tokens + request.num_output_tokens
    if num_tokens > profile.kv_capacity_tokens:
        return None
    rate, ahead_s, num_requests, num_free_kv = load.rate, load.ahead_s, load.num_requests, load.num_free_kv_tokens
    finish = prefill_s + ahead_s + request.num_output_tokens / rate
    if num_requests >= profile.max_batch:
        # Full batch: a slot frees when the first of the batch finishes, after about one request's share of the work.
        finish += ahead_s / num_requests
    if num_tokens > num_free_kv:
        finish += (num_tokens - (num_free_kv if num_free_kv > 0 else 0.0)) / rate
    return finish


def prefix_key(token_ids: tuple[int, ...], block_size: int, num_blocks: int) -> int | None:
    """A hash of the prompt's first full blocks (at most num_blocks); None when there is no full block.
    Python's hash of a tuple of ints is not salted per process, so every picker replica agrees."""
    num_blocks = min(num_blocks, len(token_ids) // block_size)
    if num_blocks == 0:
        return None
    return hash(token_ids[: num_blocks * block_size]) & _MASK64


def _mix64(x: int) -> int:
    """splitmix64's finaliser: the rendezvous score of (prefix, endpoint)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def choose(
    request: PickRequest,
    endpoints: Sequence[Endpoint],
    now: float,
    sent: Mapping[str, SentWork],
    settings: PickerSettings = DEFAULT_SETTINGS,
) -> Decision:
    """The endpoint with the least predicted finish, or the prefix's home when bounded load allows it."""
    if not endpoints:
        return Decision(None, REASON_NO_ENDPOINTS)
    scored: list[tuple[float, Endpoint, bool]] = []
    best: tuple[float, Endpoint, bool] | None = None
    num_pickable = 0
    oldest = now - settings.unreachable_after_s
    prefill_rates: dict[int, float] = {}  # by id(profile): a pool's endpoints share one profile
    for endpoint in endpoints:
        metrics = endpoint.metrics
        if not endpoint.is_ready or metrics is None or not metrics.scraped_at >= oldest:
            continue
        num_pickable += 1
        profile = endpoint.profile
        prefill_rate = prefill_rates.get(id(profile))
        if prefill_rate is None:
            prefill_rate = prefill_rates[id(profile)] = _prefill_rate(request, profile)
        load = _load(endpoint, sent.get(endpoint.address), now, prefill_rate, settings)
        finish = _finish(request, profile, load, request.num_prompt_tokens / prefill_rate)
        if finish is not None:
            item = (finish, endpoint, load.is_stale)
            scored.append(item)
            if best is None or finish < best[0]:
                best = item
    if best is None:
        return Decision(None, REASON_NONE_FITS if num_pickable else REASON_NONE_READY)
    profile = best[1].profile
    key = None
    if request.prefix_token_ids and profile.has_prefix_cache:
        key = prefix_key(request.prefix_token_ids, profile.block_size, settings.num_prefix_blocks)
    if key is None:
        return Decision(best[1], REASON_LEAST_FINISH, best[0], best[2])
    # Rendezvous (highest-random-weight) hashing with bounded load among the endpoints that can reuse the prefix's
    # blocks: prefix caches of the best endpoint's block size. Load is the predicted finish, so speed counts; the
    # home is the group's endpoint of highest score for the prefix, stable while endpoints join and leave.
    group = [
        item for item in scored if item[1].profile.has_prefix_cache and item[1].profile.block_size == profile.block_size
    ]
    bound = (1 + settings.load_epsilon) * sum(item[0] for item in group) / len(group)
    finish, endpoint, is_stale = max(group, key=lambda item: _mix64(key ^ item[1].key))
    if finish <= bound:
        return Decision(endpoint, REASON_PREFIX_AFFINITY, finish, is_stale)
    # Over the bound the speed-aware choice takes over, not the next endpoint in the prefix's hash order: walking
    # that order kept slow pools and the engines without a prefix cache out of the traffic (pickbench).
    return Decision(best[1], REASON_PREFIX_SPILLOVER, best[0], best[2])


def record_sent(
    sent: SentWork | None, endpoint: Endpoint, request: PickRequest, now: float, settings: PickerSettings
) -> SentWork:
    """The accounting after sending the request to the endpoint: its outstanding work drained to `now`, plus this."""
    load = _load(endpoint, sent, now, _prefill_rate(request, endpoint.profile), settings)
    num_prompt, num_output = request.num_prompt_tokens, request.num_output_tokens
    scraped_at = min(endpoint.metrics.scraped_at, now) if endpoint.metrics else now
    horizon = max(scraped_at, now - settings.stale_after_s)
    recent = tuple(item for item in (sent.recent if sent else ()) if item[0] >= horizon)
    sent_prompt, sent_output, sent_requests = load.sent
    return SentWork(
        sent_prompt + num_prompt,
        sent_output + num_output,
        sent_requests + 1,
        now,
        recent + ((now, num_prompt, num_output),),
    )


class EndpointPicker:
    """`choose` over the picker's own accounting of what it sent each endpoint, updated after every decision."""

    def __init__(self, settings: PickerSettings = DEFAULT_SETTINGS) -> None:
        self.settings = settings
        self.sent: dict[str, SentWork] = {}

    def pick(self, request: PickRequest, endpoints: Sequence[Endpoint], now: float) -> Decision:
        decision = choose(request, endpoints, now, self.sent, self.settings)
        endpoint = decision.endpoint
        if endpoint is not None:
            self.sent[endpoint.address] = record_sent(
                self.sent.get(endpoint.address), endpoint, request, now, self.settings
            )
        if len(self.sent) > 2 * len(endpoints) + 16:  # pods come and go: forget the ones gone
            addresses = {e.address for e in endpoints}
            self.sent = {a: s for a, s in self.sent.items() if a in addresses}
        return decision
