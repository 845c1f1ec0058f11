"""The router as a real process, or an app in a thread, on 127.0.0.1; a stand-in pod that breaks its stream after
the first event; and reading one sample from a Prometheus page."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from aiohttp import web
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

from ...runtime.support.server_harness import free_port

FIRST_EVENT = (
    b'data: {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "stub", '
    b'"choices": [{"index": 0, "text": "Hello", "logprobs": null, "finish_reason": null}]}\n\n'
)


@dataclass
class RouterProcess:
    proc: subprocess.Popen
    base_url: str
    log_path: str

    def output(self) -> str:
        with open(self.log_path) as file:
            return file.read()

    def metrics(self) -> str:
        return httpx.get(f"{self.base_url}/metrics").text


@contextmanager
def router_process(*args: str, wait_ready: bool = True, env: dict | None = None) -> Iterator[RouterProcess]:
    """`python -m inferfleet_operator.router.main ARGS` on a free port, once /ready (or /health) answers 200; env:
    variables set for it besides this process's."""
    port = free_port()
    command = [sys.executable, "-m", "inferfleet_operator.router.main", "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(
            [*command, *args], stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    router = RouterProcess(proc, f"http://127.0.0.1:{port}", log.name)
    probe = "/ready" if wait_ready else "/health"
    try:
        wait_for(
            lambda: proc.poll() is None and httpx.get(router.base_url + probe).status_code == 200,
            timeout=60,
            interval=0.1,
            message=f"the router's {probe}",
        )
        yield router
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            print(router.output()[-3000:])  # shown with a failing test's captured output
        os.unlink(log.name)


@contextmanager
def running_app(app: web.Application) -> Iterator[str]:
    """An aiohttp app served from a thread of its own (its own event loop); yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    port = free_port()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30), "the app did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


def pod_that_breaks_mid_stream() -> web.Application:
    """Ready, with an empty load, and every completion streams one event, then its connection is cut."""

    async def ready(_request):
        return web.json_response({"status": "ready"})

    async def metrics(_request):
        return web.Response(text='inferfleet:num_requests_waiting{model_name="stub"} 0\n')

    async def completions(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(FIRST_EVENT)
        await asyncio.sleep(0.05)  # the event leaves before the connection is cut
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


def sample(page: str, name: str, **labels: str) -> float:
    """The sum of a page's samples called name whose labels include labels (0 when there is none)."""
    total = 0.0
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
