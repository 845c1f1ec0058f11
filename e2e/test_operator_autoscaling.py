"""Autoscaling on the local cluster with a metrics stand-in: KWOK pods run nothing, so a small HTTP server on
loopback answers each serving pod's /metrics (the operator reaches it through --scrape-url-template). Load
raises the pool to what the HPA formula asks, within maxReplicas; idle brings it back to minReplicas after the
stabilization window. Prints the figures: time to scaled-up and Ready, replicas reached vs needed."""

from __future__ import annotations

import http.server
import math
import threading
import time

import pytest
from helpers import wait_for
from operator_process import FAST_FLAGS, OperatorProcess, events, install, service_manifest, serving

pytestmark = pytest.mark.e2e

STABILIZATION_SECONDS = 6


class StandIn:
    """Serves `inferfleet:num_requests_waiting` = `waiting` for every pod, on 127.0.0.1."""

    def __init__(self):
        self.waiting = 0.0
        self.num_scrapes = 0
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                stand_in.num_scrapes += 1
                body = (
                    f'inferfleet:num_requests_waiting{{model_name="scaled"}} {stand_in.waiting}\n'
                    f'inferfleet:kv_cache_usage_perc{{model_name="scaled"}} 0.1\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stand_in():
    server = StandIn()
    yield server
    server.close()


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory, stand_in):
    work = tmp_path_factory.mktemp("autoscaling")
    template = f"http://127.0.0.1:{stand_in.port}/{{namespace}}/{{pod}}/metrics"
    process = OperatorProcess(
        install(cluster, work),
        work / "operator.log",
        FAST_FLAGS + ["--inference-pools=disabled", "--autoscale-seconds=1", f"--scrape-url-template={template}"],
    )
    with serving(cluster, process):
        yield process


def _deployment(cluster, ns):
    return cluster.get("deployment", "scaled-cpu-amd64", ns) or {}


def _ready(cluster, ns, replicas, at_least=False):
    """The pool's Deployment asks for `replicas` (or more, with at_least) and all of them are ready."""
    d = _deployment(cluster, ns)
    wanted = d.get("spec", {}).get("replicas") or 0
    return (wanted >= replicas if at_least else wanted == replicas) and d.get("status", {}).get(
        "readyReplicas"
    ) == wanted


def test_load_scales_the_pool_up_within_max_and_idle_brings_it_back_to_min(cluster, ns, operator, stand_in):
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetWaitingRequests": 2,
        "scaleDownStabilizationSeconds": STABILIZATION_SECONDS,
    }
    cluster.apply(
        service_manifest("scaled", replicas=1, placement={"vendors": ["cpu"]}, autoscaling=autoscaling), namespace=ns
    )
    wait_for(lambda: _ready(cluster, ns, 1), timeout=45, message="one ready replica")
    scrapes = stand_in.num_scrapes
    wait_for(lambda: stand_in.num_scrapes > scrapes, timeout=15, message="the operator scraping the pod")
    assert _deployment(cluster, ns)["spec"]["replicas"] == 1, "idle at min: no scale"

    stand_in.waiting = 5.0  # 5 queued per replica against 2: ceil(1 * 5 / 2) = 3
    started = time.monotonic()
    # 3 first; with 3 replicas each still reporting 5 the next decision may already ask for more.
    wait_for(lambda: _ready(cluster, ns, 3, at_least=True), timeout=45, message="at least 3 ready replicas under load")
    scaled_up = time.monotonic() - started
    status = cluster.get("inferenceservice", "scaled", ns)["status"]["autoscaling"]
    (entry,) = status["pools"]
    assert entry["metric"] == "inferfleet:num_requests_waiting" and entry["target"] == "2"
    # Three replicas each reporting 5 now ask for ceil(3 * 5 / 2) = 8: held at maxReplicas.
    wait_for(lambda: _ready(cluster, ns, 4), timeout=45, message="maxReplicas under sustained load")
    scrapes = stand_in.num_scrapes
    wait_for(lambda: stand_in.num_scrapes >= scrapes + 3 * 4, timeout=30, message="three more decisions at max")
    peak = _deployment(cluster, ns)["spec"]["replicas"]
    assert peak == 4
    (at_max,) = cluster.get("inferenceservice", "scaled", ns)["status"]["autoscaling"]["pools"]
    assert at_max["reason"] == "MaxReplicas"
    needed = math.ceil(at_max["currentReplicas"] * float(at_max["value"]) / float(at_max["target"]))

    stand_in.waiting = 0.0
    idle_at = time.monotonic()
    wait_for(lambda: _ready(cluster, ns, 1), timeout=60, message="back to minReplicas once idle")
    scaled_down = time.monotonic() - idle_at
    assert scaled_down >= STABILIZATION_SECONDS - 1, "not before the stabilization window"
    reasons = [e["reason"] for e in events(cluster, ns, "scaled")]
    assert "ScaledUp" in reasons and "ScaledDown" in reasons
    print(
        f"\nautoscaling figures: load start -> 3 replicas Ready {scaled_up:.1f} s; peak {peak} replicas "
        f"(max 4, the formula asked {needed}); idle -> 1 replica Ready {scaled_down:.1f} s (window {STABILIZATION_SECONDS} s)"
    )
