"""RouterError: an answer the router gives itself, in the runtime's (OpenAI's) JSON error shape."""

from __future__ import annotations

import json

from aiohttp import web

RETRY_AFTER_S = 1


class RouterError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}


def unavailable(message: str, code: str) -> RouterError:
    return RouterError(503, message, "ServiceUnavailable", code=code, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_body(error: RouterError) -> dict:
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def error_response(error: RouterError) -> web.Response:
    return web.Response(
        body=json.dumps(error_body(error)).encode(),
        status=error.status,
        content_type="application/json",
        headers=error.headers,
    )


def sse_error_event(message: str) -> bytes:
    """The in-band error of a stream whose headers are sent already (as the runtime writes it), then its end."""
    error = RouterError(502, message, "server_error")
    return f"data: {json.dumps(error_body(error))}\n\ndata: [DONE]\n\n".encode()
