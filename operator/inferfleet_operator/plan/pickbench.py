"""pickbench: the endpoint picker's CPU cost per decision, and a simulated mixed-vendor service routed three ways (`python -m inferfleet_operator.plan.pickbench`)."""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from inferfleet_operator.plan.endpoint_picker import (
    Endpoint,
    EndpointMetrics,
    EndpointPicker,
    PickRequest,
    PoolProfile,
)

# Three vendors' pools, several-fold apart (full-batch decode 2,600 / 1,400 / 450 tokens/s); the third runs the
# compiled engine: no prefix cache, 32-token blocks, smaller batch and KV.
POOLS = {  # name -> profile
    "nvidia-h100": PoolProfile(((128, 9000), (2048, 20000)), ((1, 100), (8, 640), (32, 1800), (64, 2600)),
                               64, 300_000, 16, True),
    "amd-mi300x": PoolProfile(((128, 5000), (2048, 11000)), ((1, 60), (8, 360), (32, 1000), (64, 1400)),
                              64, 500_000, 16, True),
    "intel-compiled": PoolProfile(((128, 2000), (2048, 4000)), ((1, 30), (8, 160), (32, 450)), 32, 60_000, 32, False),
}  # fmt: skip
NUM_PODS_PER_POOL = 20
SYSTEM_PROMPT = 256  # tokens of a shared system prompt at the start of every prompt (one of NUM_PREFIXES)
NUM_PREFIXES = 16
PREFIX_IDS = 64  # token ids the picker hashes (4 blocks of 16)
USER_TOKENS = (32, 768)  # uniform, after the system prompt
OUTPUT_TOKENS = (16, 512)  # uniform; the picker is told only the mean
EXPECTED_OUTPUT = sum(OUTPUT_TOKENS) // 2
MEAN_PROMPT = SYSTEM_PROMPT + sum(USER_TOKENS) // 2
CACHED_PREFIXES_PER_POD = 4
SCRAPE_S = 0.1


def prefix_tokens(prefix_id: int) -> tuple[int, ...]:
    return tuple(range(prefix_id * 1000, prefix_id * 1000 + PREFIX_IDS))


def pod_capacity(profile: PoolProfile) -> float:
    """Requests/s one pod sustains at a full batch: its prefill pauses decoding, its output shares the batch."""
    return 1 / (
        MEAN_PROMPT / profile.prefill_rate(MEAN_PROMPT) + EXPECTED_OUTPUT / profile.decode_rate(profile.max_batch)
    )


@dataclass
class Job:
    arrival: float
    num_prompt: int
    num_output: int
    prefix_id: int
    first_token_at: float | None = None
    done_at: float | None = None
    start_mark: float = 0.0  # the pod's per-sequence progress when the job joined the batch


@dataclass
class Pod:
    """A continuous-batching engine as a fluid model: a prompt's prefill pauses the batch; decoding shares the
    profile's aggregate rate at the current batch size equally among the running sequences."""

    address: str
    pool: str
    profile: PoolProfile
    is_liar: bool = False  # reports an empty queue forever
    waiting: deque = field(default_factory=deque)
    prefilling: Job | None = None
    prefill_end: float = 0.0
    running: list = field(default_factory=list)  # heap of (finish mark, id, job)
    served: float = 0.0  # tokens each running sequence has generated since t=0 (the fluid clock)
    last: float = 0.0
    num_tokens_out: float = 0.0
    num_kv_used: int = 0
    version: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)  # prefix ids, least recent first
    tokens_at_scrape: float = 0.0

    def per_sequence_rate(self) -> float:
        batch = len(self.running)
        return self.profile.decode_rate(batch) / batch

    def advance(self, now: float) -> None:
        if self.prefilling is None and self.running:
            progress = self.per_sequence_rate() * (now - self.last)
            self.served += progress
            self.num_tokens_out += progress * len(self.running)
        self.last = now

    def next_event(self) -> float | None:
        if self.prefilling is not None:
            return self.prefill_end
        if self.running:
            return self.last + max(0.0, self.running[0][0] - self.served) / self.per_sequence_rate()
        return None

    def step(self, now: float, finished: list[Job]) -> None:
        self.advance(now)
        job = self.prefilling
        if job is not None and self.prefill_end <= now + 1e-12:
            job.first_token_at, job.start_mark, self.prefilling = now, self.served, None
            heapq.heappush(self.running, (self.served + job.num_output - 1, id(job), job))
        while self.running and self.running[0][0] <= self.served + 1e-9:
            done = heapq.heappop(self.running)[2]
            done.done_at = now
            self.num_kv_used -= done.num_prompt + done.num_output
            finished.append(done)
        if self.prefilling is None and self.waiting and len(self.running) < self.profile.max_batch:
            job = self.waiting[0]
            if self.num_kv_used + job.num_prompt + job.num_output <= self.profile.kv_capacity_tokens:
                self.waiting.popleft()
                self.num_kv_used += job.num_prompt + job.num_output
                num_tokens = job.num_prompt
                if self.profile.has_prefix_cache:
                    if job.prefix_id in self.cache:
                        num_tokens -= SYSTEM_PROMPT
                    self.cache[job.prefix_id] = True
                    self.cache.move_to_end(job.prefix_id)
                    if len(self.cache) > CACHED_PREFIXES_PER_POD:
                        self.cache.popitem(last=False)
                self.prefilling = job
                self.prefill_end = now + num_tokens / self.profile.prefill_rate(job.num_prompt)

    def metrics(self, now: float) -> EndpointMetrics:
        observed = (self.num_tokens_out - self.tokens_at_scrape) / SCRAPE_S  # measured by the gateway: honest
        self.tokens_at_scrape = self.num_tokens_out
        if self.is_liar:
            return EndpointMetrics(now, observed_tokens_per_s=observed)
        queued = list(self.waiting) + ([self.prefilling] if self.prefilling is not None else [])
        running = sum(max(0.0, EXPECTED_OUTPUT - (self.served - j.start_mark)) for _, _, j in self.running)
        return EndpointMetrics(now, sum(j.num_prompt for j in queued), EXPECTED_OUTPUT * len(queued), running,
                               len(self.running), len(self.waiting), self.num_kv_used / self.profile.kv_capacity_tokens,
                               observed)  # fmt: skip


def make_jobs(rate: float, seconds: float, rng: random.Random) -> list[Job]:
    weights = [1 / (k + 1) for k in range(NUM_PREFIXES)]
    jobs, now = [], 0.0
    while True:
        now += rng.expovariate(rate)
        if now >= seconds:
            return jobs
        prefix_id = rng.choices(range(NUM_PREFIXES), weights)[0]
        jobs.append(Job(now, SYSTEM_PROMPT + rng.randint(*USER_TOKENS), rng.randint(*OUTPUT_TOKENS), prefix_id))


def make_pods(num_liars_per_pool: int = 0) -> list[Pod]:
    return [Pod(f"{name}-{i}", name, profile, i < num_liars_per_pool)
            for name, profile in POOLS.items() for i in range(NUM_PODS_PER_POOL)]  # fmt: skip


class RoundRobin:
    def __init__(self, pods):
        self.cycle = itertools.cycle(pods)

    def route(self, job, now):
        return next(self.cycle)

    def finished(self, pod):
        pass

    def scraped(self, pods, now):
        pass


class LeastRequests:
    """Fewest requests in flight as the router counts them (it sees every response end); ties rotate."""

    def __init__(self, pods):
        self.pods, self.in_flight, self.turn = pods, Counter(), 0

    def route(self, job, now):
        self.turn += 1
        n = len(self.pods)
        pod = min((self.pods[(self.turn + i) % n] for i in range(n)), key=lambda p: self.in_flight[p.address])
        self.in_flight[pod.address] += 1
        return pod

    def finished(self, pod):
        self.in_flight[pod.address] -= 1

    def scraped(self, pods, now):
        pass


class Picker:
    """The endpoint picker over metrics scraped every SCRAPE_S; it is never told when a response ends."""

    def __init__(self, pods):
        self.picker, self.by_address, self.endpoints = EndpointPicker(), {p.address: p for p in pods}, []

    def route(self, job, now):
        request = PickRequest(job.num_prompt, EXPECTED_OUTPUT, prefix_tokens(job.prefix_id))
        endpoint = self.picker.pick(request, self.endpoints, now).endpoint
        return None if endpoint is None else self.by_address[endpoint.address]

    def finished(self, pod):
        pass

    def scraped(self, pods, now):
        self.endpoints = [Endpoint(p.address, p.pool, p.profile, True, p.metrics(now)) for p in pods]


def simulate(policy_type, jobs: list[Job], seconds: float, warmup: float, num_liars_per_pool: int = 0) -> dict:
    pods = make_pods(num_liars_per_pool)
    policy = policy_type(pods)
    events: list = []  # (time, sequence, kind, payload, version)
    sequence = itertools.count()
    heapq.heappush(events, (0.0, next(sequence), "scrape", None, 0))
    for job in jobs:
        heapq.heappush(events, (job.arrival, next(sequence), "arrival", job, 0))
    routed: dict[int, Pod] = {}
    tokens_at_warmup = None
    finished: list[Job] = []
    while events:
        now, _, kind, payload, version = heapq.heappop(events)
        if now >= seconds:
            break
        if tokens_at_warmup is None and now >= warmup:
            for pod in pods:
                pod.advance(now)
            tokens_at_warmup = sum(p.num_tokens_out for p in pods)
        if kind == "scrape":
            for pod in pods:
                pod.advance(now)
            policy.scraped(pods, now)
            heapq.heappush(events, (now + SCRAPE_S, next(sequence), "scrape", None, 0))
            continue
        if kind == "arrival":
            pod = policy.route(payload, now)
            if pod is None:
                continue
            routed[id(payload)] = pod
            pod.waiting.append(payload)
        else:
            pod = payload
            if version != pod.version:
                continue
        pod.step(now, finished)
        for done in finished:
            policy.finished(routed[id(done)])
        finished.clear()
        pod.version += 1
        at = pod.next_event()
        if at is not None:
            heapq.heappush(events, (at, next(sequence), "pod", pod, pod.version))
    for pod in pods:
        pod.advance(seconds)
    window = [j for j in jobs if warmup <= j.arrival < seconds]
    ttfts = sorted((j.first_token_at if j.first_token_at is not None else seconds) - j.arrival for j in window)
    e2es = sorted((j.done_at if j.done_at is not None else seconds) - j.arrival for j in window)
    shares = Counter(routed[id(j)].pool for j in window if id(j) in routed)
    liar_share = sum(1 for j in window if id(j) in routed and routed[id(j)].is_liar)
    return {
        "output_tok_s": (sum(p.num_tokens_out for p in pods) - (tokens_at_warmup or 0.0)) / (seconds - warmup),
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p99": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))],
        "e2e_p50": e2es[len(e2es) // 2],
        "e2e_p99": e2es[min(len(e2es) - 1, int(len(e2es) * 0.99))],
        "unserved": sum(j.first_token_at is None for j in window) / len(window),
        "shares": {name: shares[name] / len(window) for name in POOLS},
        "liar_share": liar_share / len(window),
    }


def decisions_per_second(num_endpoints: int, num_picks: int, rng: random.Random) -> float:
    """CPU-time decisions/s (best of three) over endpoints of the three pools, re-scraped every 100 decisions."""
    profiles = list(POOLS.items())
    requests = [PickRequest(rng.randint(64, 1024), EXPECTED_OUTPUT, prefix_tokens(i % NUM_PREFIXES) if i % 2 else ())
                for i in range(256)]  # fmt: skip

    def scrape(now: float) -> list[Endpoint]:
        endpoints = []
        for i in range(num_endpoints):
            name, profile = profiles[i % 3]
            metrics = EndpointMetrics(now - rng.random() * SCRAPE_S, rng.random() * 8000, rng.random() * 4000,
                                      rng.random() * 20000, rng.randrange(profile.max_batch + 8), rng.randrange(8),
                                      rng.random(), rng.random() * profile.decode_rate(64))  # fmt: skip
            endpoints.append(Endpoint(f"10.{i // 250}.{i % 250}.1:8000", name, profile, rng.random() > 0.02, metrics))
        return endpoints

    best = 0.0
    for _ in range(3):
        picker, cpu, now = EndpointPicker(), 0.0, 0.0
        for start in range(0, num_picks, 100):
            endpoints = scrape(now)
            began = time.process_time()
            for k in range(start, min(num_picks, start + 100)):
                now += 0.001
                picker.pick(requests[k % len(requests)], endpoints, now)
            cpu += time.process_time() - began
        best = max(best, num_picks / cpu)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds per run")
    parser.add_argument("--warmup", type=float, default=10.0, help="simulated seconds left out of the figures")
    parser.add_argument("--loads", default="0.5,0.8,1.0,1.2", help="offered load, fractions of summed capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-cost", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)

    if not args.skip_cost:
        for num_endpoints, num_picks in ((10, 20000), (100, 4000), (1000, 400)):
            print(f"decisions/s, {num_endpoints} endpoints: {decisions_per_second(num_endpoints, num_picks, rng):,.0f}")

    capacity = sum(pod_capacity(profile) * NUM_PODS_PER_POOL for profile in POOLS.values())
    print(f"pools: {', '.join(f'{n} {pod_capacity(p):.2f} req/s/pod' for n, p in POOLS.items())}; "
          f"{NUM_PODS_PER_POOL} pods each; summed capacity {capacity:.0f} req/s")  # fmt: skip
    print(
        "load  policy           out tok/s  TTFT p50  TTFT p99  E2E p50  E2E p99  unserved  share " + " / ".join(POOLS)
    )
    runs = [
        (load, policy, 0)
        for load in map(float, args.loads.split(","))
        for policy in (RoundRobin, LeastRequests, Picker)
    ]
    runs.append((1.0, Picker, 1))  # the first pod of each pool reports an empty queue forever
    liar_fair = sum(pod_capacity(profile) for profile in POOLS.values()) / capacity
    for load, policy, num_liars in runs:
        jobs = make_jobs(load * capacity, args.seconds, random.Random(f"{args.seed}-{load}"))
        result = simulate(policy, jobs, args.seconds, args.warmup, num_liars)
        name = policy.__name__ + (" +liars" if num_liars else "")
        shares = " / ".join(f"{result['shares'][n]:.2f}" for n in POOLS)
        print(f"{load:4.0%}  {name:15s} {result['output_tok_s']:10,.0f} {result['ttft_p50']:8.2f}s {result['ttft_p99']:8.2f}s"
              f" {result['e2e_p50']:7.2f}s {result['e2e_p99']:7.2f}s"
              f" {result['unserved']:8.1%}  {shares}" + (f"  liars {result['liar_share']:.3f} (fair {liar_fair:.3f})" if num_liars else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
