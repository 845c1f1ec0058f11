"""ServerMetrics: the Prometheus registry of one server (Gateway API Inference Extension model-server semantics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self._waiting = Gauge(
            "inferfleet:num_requests_waiting", "Requests queued, not yet running.", labels, registry=r
        )
        self._running = Gauge("inferfleet:num_requests_running", "Requests running on the engine.", labels, registry=r)
        self._kv_usage = Gauge(
            "inferfleet:kv_cache_usage_perc",
            "KV cache utilisation, 0 to 1 (blocks in use over all blocks).",
            labels,
            registry=r,
        )
        self._ttft = Histogram(
            "inferfleet:time_to_first_token_seconds", "Time to first token.", labels, buckets=TTFT_BUCKETS, registry=r
        )
        self._itl = Histogram(
            "inferfleet:inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            labels,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            "inferfleet:e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            labels,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self._prompt_tokens = Counter("inferfleet:prompt_tokens_total", "Prompt tokens processed.", labels, registry=r)
        self._generation_tokens = Counter("inferfleet:generation_tokens_total", "Tokens generated.", labels, registry=r)
        self._preemptions = Counter(
            "inferfleet:num_preemptions_total", "Requests preempted for recompute.", labels, registry=r
        )
        self._num_preemptions_seen = 0
        self._labels = {"model_name": model_name}
        for metric in (
            self._waiting,
            self._running,
            self._kv_usage,
            self._ttft,
            self._itl,
            self._e2e,
            self._prompt_tokens,
            self._generation_tokens,
            self._preemptions,
        ):
            metric.labels(**self._labels)  # exposed at zero before the first request

    def observe_engine(self, num_waiting: int, num_running: int, kv_cache_usage: float, num_preemptions: int) -> None:
        self._waiting.labels(**self._labels).set(num_waiting)
        self._running.labels(**self._labels).set(num_running)
        self._kv_usage.labels(**self._labels).set(kv_cache_usage)
        if num_preemptions > self._num_preemptions_seen:
            self._preemptions.labels(**self._labels).inc(num_preemptions - self._num_preemptions_seen)
            self._num_preemptions_seen = num_preemptions

    def observe_first_token(self, seconds: float) -> None:
        self._ttft.labels(**self._labels).observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self._itl.labels(**self._labels).observe(seconds)

    def observe_finished(self, e2e_seconds: float, num_prompt_tokens: int) -> None:
        self._e2e.labels(**self._labels).observe(e2e_seconds)
        self._prompt_tokens.labels(**self._labels).inc(num_prompt_tokens)

    def count_generated(self, num_tokens: int) -> None:
        self._generation_tokens.labels(**self._labels).inc(num_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
