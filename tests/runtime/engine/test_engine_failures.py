"""A batch that fails inside the model fails only its own requests (a JSON 500, or an in-band error event when
streaming), frees their KV blocks and leaves the engine serving; a device that fails every batch stops the engine,
and /health then answers 503 so the kubelet's liveness probe restarts the pod."""

import json

import httpx
import pytest

from inferfleet_runtime.engine.async_engine import MAX_FAILED_STEPS_IN_A_ROW
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
POISON = [7, 7, 7, 7]  # a prompt starting with these token ids makes the model fail on its batch


class FailingRunner:
    """The real runner, failing on any batch that holds a poisoned prompt (or on every batch once broken)."""

    def __init__(self, runner):
        self.runner, self.is_broken, self.num_failed = runner, False, 0

    def execute(self, batch):
        if self.is_broken or any(seq.token_ids[: len(POISON)] == POISON for seq in batch.seqs):
            self.num_failed += 1
            raise RuntimeError("device fault on this batch")
        return self.runner.execute(batch)

    def __getattr__(self, name):
        return getattr(self.runner, name)


@pytest.fixture
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", num_kv_blocks=64, max_context_length=64)
    holder = {}

    def make():
        holder["runner"] = FailingRunner(ModelRunner.from_model_dir(demo_model_dir, config))
        return holder["runner"]

    with running_server(make, config, MODEL) as srv:
        srv.failing = holder["runner"]
        yield srv


def complete(server, prompt, stream=False, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream, **extra}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)


def test_a_failing_batch_fails_its_request_and_the_engine_serves_on(server):
    before = complete(server, "Beautiful is").json()["choices"][0]["text"]
    failed = complete(server, POISON + [5])
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "server_error" and "device fault on this batch" in error["message"]
    assert complete(server, "Beautiful is").json()["choices"][0]["text"] == before
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    stats = server.state.engine.stats
    assert stats.num_free_blocks == stats.num_blocks and stats.num_running == 0  # its blocks were freed


def test_a_failing_streamed_request_ends_with_an_error_event(server):
    response = complete(server, POISON, stream=True)
    assert response.status_code == 200  # the headers went out before the batch ran
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "device fault" in error["message"]
    assert complete(server, "Beautiful is").status_code == 200


def test_a_device_that_fails_every_batch_stops_the_engine_and_health_says_so(server):
    server.failing.is_broken = True
    statuses = [complete(server, "Beautiful is").status_code for _ in range(MAX_FAILED_STEPS_IN_A_ROW)]
    assert statuses[: MAX_FAILED_STEPS_IN_A_ROW - 1] == [500] * (MAX_FAILED_STEPS_IN_A_ROW - 1)
    assert statuses[-1] == 503  # the step that broke the engine
    health = httpx.get(f"{server.base_url}/health")
    assert health.status_code == 503 and "device fault" not in health.text  # the cause is in the log, not here
    assert health.json()["error"] == "the engine stopped; the server's log says why"
    assert complete(server, "Beautiful is").status_code == 503
