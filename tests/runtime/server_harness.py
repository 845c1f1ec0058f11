"""A real uvicorn server on 127.0.0.1 (random free port) in a thread, for the server tests."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from inferfleet_runtime.engine_config import EngineConfig
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
