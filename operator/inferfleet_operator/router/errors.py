"""RouterError: an answer the router gives itself, in the runtime's (OpenAI's) JSON error shape."""

from __future__ import annotations

import json

from aiohttp import web

from inferfleet_runtime.server.errors import APIError

RETRY_AFTER_S = 1


class RouterError(APIError):
    """An answer the router gives itself: the runtime's APIError, so both speak one error shape."""


def unavailable(message: str, code: str) -> RouterError:
    return RouterError(503, message, "ServiceUnavailable", code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_response(error: RouterError) -> web.Response:
    return web.Response(
        body=json.dumps(error.body()).encode(),
        status=error.status,
        content_type="application/json",
        headers=error.headers,
    )


def sse_error_event(message: str) -> bytes:
    """The in-band error of a stream whose headers are sent already (as the runtime writes it), then its end."""
    error = RouterError(502, message, "server_error")
    return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
