"""Real servers for the server tests: uvicorn in a thread (running_server), or the `serve` command in its own
process (serve_process), each on 127.0.0.1 at a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import uvicorn

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.server.app import ServerState, create_app
from inferfleet_runtime.server.cli import build_state


@dataclass
class RunningServer:
    base_url: str
    state: ServerState

    @property
    def engine(self):
        return self.state.engine.engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    make_runner,
    config: EngineConfig,
    served_model_name: str,
    wait_ready: bool = True,
    api_keys=None,
    protect_metrics: bool = False,
    **state_fields,
):
    state, load = build_state(make_runner, config, served_model_name, api_keys, protect_metrics, **state_fields)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state, load), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
            time.sleep(0.05)
        if wait_ready:
            while httpx.get(f"{base_url}/ready").status_code != 200:
                assert time.monotonic() < deadline and state.load_error is None, state.load_error
                time.sleep(0.05)
        yield RunningServer(base_url, state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class ServeProcess:
    """A `serve` process that answered /ready; `output` (stdout and stderr) and `returncode` once it has ended."""

    proc: subprocess.Popen
    base_url: str
    output: str = field(default="", init=False)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


@contextmanager
def serve_process(*args: str, env: dict | None = None, ready_timeout_s: float = 180) -> Iterator[ServeProcess]:
    """Runs `inferfleet_runtime.cli serve ARGS --host 127.0.0.1 --port P` until /ready answers 200, then yields it;
    on leaving, SIGINT (SIGKILL after 30 s) unless it has already exited, and its output is read."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "inferfleet_runtime.cli",
        "serve",
        *args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(
        command, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    served = ServeProcess(proc, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            assert proc.poll() is None, f"serve exited with {proc.returncode}: {proc.stdout.read()[-3000:]}"
            try:
                if httpx.get(f"{served.base_url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.2)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        served.output = proc.stdout.read()
