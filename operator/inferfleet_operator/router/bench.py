"""The router's benchmark (`python -m inferfleet_operator.router.bench`; prints figures, not a test): the time to
first token the router adds over going straight to a pod (the demo model, alternating in one run), and how many
idle streams one router holds with its resident memory."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

OPEN_BATCH = 100  # idle streams opened at once
FIRST_EVENT = b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]}\n\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def _process(command: list[str], url: str, probe: str = "/ready"):
    """A server process, once `url + probe` answers 200; SIGINT when done."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{command[2]} exited with {proc.returncode}")
                try:
                    async with http.get(url + probe) as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not become ready")
                await asyncio.sleep(0.2)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def _router_command(port: int, *endpoints: str) -> list[str]:
    flags = [f"--endpoint={url}" for url in endpoints]
    command = [sys.executable, "-m", "inferfleet_operator.router.main", "--host", "127.0.0.1", "--port", str(port)]
    return [*command, *flags, "--log-level", "warning"]


async def _ttft(http: aiohttp.ClientSession, url: str, body: dict) -> float:
    """Seconds from sending a streamed completion to its first event with text."""
    start = time.perf_counter()
    async with http.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"data: {"):
                ttft = time.perf_counter() - start
                break
        async for _ in response.content:  # to the end, so the connection is reused
            pass
    return ttft


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def bench_ttft(model_dir: str, num_requests: int) -> None:
    pod_port, router_port = _free_port(), _free_port()
    pod_url, router_url = f"http://127.0.0.1:{pod_port}", f"http://127.0.0.1:{router_port}"
    serve = [sys.executable, "-m", "inferfleet_runtime.cli", "serve", "--model", model_dir, "--host", "127.0.0.1"]
    serve += ["--port", str(pod_port), "--num-kv-blocks", "256", "--log-level", "warning"]
    body = {"model": "inferfleet-demo", "prompt": "Beautiful is better than", "max_tokens": 4, "stream": True}
    async with _process(serve, pod_url), _process(_router_command(router_port, pod_url), router_url):
        async with aiohttp.ClientSession() as http:
            for url in (pod_url, router_url) * 5:  # warm both paths' connections and caches
                await _ttft(http, url, body)
            direct, routed = [], []
            for _ in range(num_requests):
                direct.append(await _ttft(http, pod_url, body))
                routed.append(await _ttft(http, router_url, body))
    ms = [1000 * statistics.median(direct), 1000 * statistics.median(routed)]
    print(f"TTFT over {num_requests} streamed completions each, alternating (max_tokens 4, one at a time):")
    print(f"  straight to the pod   p50 {ms[0]:.2f} ms  p90 {1000 * _percentile(direct, 90):.2f} ms")
    print(f"  through the router    p50 {ms[1]:.2f} ms  p90 {1000 * _percentile(routed, 90):.2f} ms")
    print(f"  added by the router   p50 {ms[1] - ms[0]:.2f} ms")


def _idle_pod() -> web.Application:
    """A stand-in pod whose every stream sends one event and then stays open, silent, until the client leaves."""

    async def ready(_request):
        return web.json_response({"status": "ready"})

    async def metrics(_request):
        return web.Response(text="")

    async def completions(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(FIRST_EVENT)
        await asyncio.Event().wait()  # cancelled when the router closes the connection
        return response

    app = web.Application()
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


async def bench_idle_streams(levels: list[int]) -> None:
    pod_port, router_port = _free_port(), _free_port()
    runner = web.AppRunner(_idle_pod(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", pod_port, backlog=4096).start()
    router_url = f"http://127.0.0.1:{router_port}"
    body = {"model": "stub", "prompt": "x", "max_tokens": 4, "stream": True}
    print("Idle streams held by one router (each: one event, then silence), router RSS:")
    async with _process(_router_command(router_port, f"http://127.0.0.1:{pod_port}"), router_url) as router:
        print(f"  {0:>6} streams  RSS {_rss_mib(router.pid):7.1f} MiB")
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60, sock_read=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            held: list[aiohttp.ClientResponse] = []

            async def open_one() -> aiohttp.ClientResponse:
                response = await http.post(f"{router_url}/v1/completions", json=body)
                first = await response.content.readline()
                assert response.status == 200 and first == FIRST_EVENT[:-1], (response.status, first)
                return response

            for level in levels:
                start = time.perf_counter()
                while len(held) < level:  # a batch at a time: the listen backlogs are finite
                    batch = min(OPEN_BATCH, level - len(held))
                    held += await asyncio.gather(*(open_one() for _ in range(batch)))
                seconds = time.perf_counter() - start
                await asyncio.sleep(1)
                print(f"  {len(held):>6} streams  RSS {_rss_mib(router.pid):7.1f} MiB  (opened in {seconds:.1f} s)")
            for response in held:
                response.close()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferfleet_operator.router.bench", description=__doc__)
    parser.add_argument("--model", help="model directory to serve (default: the built-in demo model)")
    parser.add_argument("--requests", type=int, default=200, help="TTFT samples per path")
    parser.add_argument(
        "--streams", default="1000,2000,4000,8000", help="idle stream counts to reach, ascending (2 files each)"
    )
    args = parser.parse_args(argv)
    model_dir = args.model
    if model_dir is None:
        from inferfleet_runtime.demo.builtin_model import ensure_demo_model  # the runtime, for this tool only

        model_dir = str(ensure_demo_model())
    print(f"python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}, {os.cpu_count()} CPUs")
    asyncio.run(bench_ttft(model_dir, args.requests))
    asyncio.run(bench_idle_streams([int(n) for n in args.streams.split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
