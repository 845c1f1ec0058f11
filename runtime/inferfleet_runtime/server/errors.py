"""APIError: an error answer in OpenAI's JSON shape, stdlib only, so the router (operator image, no FastAPI) gives
the runtime's errors with the same class."""

from __future__ import annotations


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        """{"error": {message, type, param, code}}: what the client reads."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
