"""kube.Transport over an httpx.MockTransport: the operator tests' fake API servers are httpx handlers
(request in, response out), run in memory with no socket."""

from __future__ import annotations

import httpx

from inferfleet_operator.kube.client import Reply


class HttpxTransport:
    def __init__(self, handler, base_url: str = "https://api.test"):
        self.http = httpx.AsyncClient(base_url=base_url, transport=httpx.MockTransport(handler))

    def handle_with(self, handler) -> None:
        """Swaps the fake API server's handler (a test that spies on or refuses requests)."""
        self.http._transport = httpx.MockTransport(handler)

    async def send(self, method, path, *, params, content, headers) -> Reply:
        response = await self.http.request(method, path, params=params, content=content, headers=headers)
        return Reply(response.status_code, response.reason_phrase, response.content)

    async def close(self) -> None:
        await self.http.aclose()
