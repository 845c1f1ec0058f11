"""The FastAPI app: OpenAI completions and chat (SSE streaming), models, health, readiness, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferfleet_runtime.engine.async_engine import AsyncEngine, EngineDeadError, QueueFullError, RequestFailedError
from inferfleet_runtime.engine.llm_engine import CompletionOutput, ContextLengthError, RequestOutput
from inferfleet_runtime.engine.metrics import ServerMetrics
from inferfleet_runtime.server.auth import ApiKeys
from inferfleet_runtime.server.errors import APIError
from inferfleet_runtime.server.formats import ChatFormat, CompletionFormat, usage
from inferfleet_runtime.server.protocol import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1
MAX_BODY_BYTES = 8 << 20  # default request body limit (a 128k-token prompt as ids is about 1 MiB of JSON)
# Default output budget of one request, in tokens (SamplingParams.num_budget_tokens: prompts x n x max_tokens, a token
# with logprobs=k counting k + 2). A non-streamed answer peaks (choices, response body and its JSON together) at
# about 200-320 bytes per budget token for completions and 700 for chat with logprobs (whose entries carry their
# bytes): 2^20 holds one at about 0.3 GiB, 0.7 GiB at worst, where 64 prompts x n=16 x 4,000 tokens x 22
# (logprobs=20) is 90 million, 86x over. Still allowed: n=16 over a 32k context, logprobs=20 over 47k tokens.
MAX_REQUEST_OUTPUT_TOKENS = 1 << 20
OPEN_PATHS = frozenset({"/health", "/ready"})  # the kubelet's probes: never behind a key


@dataclass
class ServerState:
    served_model_name: str
    metrics: ServerMetrics
    engine: AsyncEngine | None = None  # None until the model has loaded
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    api_keys: ApiKeys | None = None  # None: the OpenAI endpoints are open
    protect_metrics: bool = False  # /metrics asks for a key too (then scrapers need one)
    max_body_bytes: int = MAX_BODY_BYTES
    max_request_output_tokens: int = MAX_REQUEST_OUTPUT_TOKENS
    profile: dict | None = None  # the engine's measured pool profile (serve --calibrate), the router's fields


def create_app(state: ServerState, load: Callable[[], AsyncEngine] | None = None) -> FastAPI:
    """The app over state; load (if given) builds and starts the engine in a thread at startup."""

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if load is not None:
            threading.Thread(target=_load_engine, args=(state, load), name="inferfleet-load", daemon=True).start()
        yield
        if state.engine is not None:
            state.engine.stop()

    app = FastAPI(title="inferfleet runtime", lifespan=lifespan)
    app.state.server = state
    app.add_middleware(BodyLimit, max_bytes=state.max_body_bytes)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):
        return _error_response(_validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        # Routing (404, 405) and body reading (413, 400) errors, in OpenAI's shape like every other error.
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_response(APIError(exc.status_code, str(exc.detail), type_, headers=exc.headers))

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        # With keys, every path but the probes needs one: /v1/*, the API's schema and its pages (/openapi.json,
        # /docs, /redoc), unknown paths; /metrics and /profile only with protect_metrics.
        path = request.url.path
        guarded = path not in OPEN_PATHS and (path not in ("/metrics", "/profile") or state.protect_metrics)
        if guarded and state.api_keys is not None and not state.api_keys.allows(request.headers.get("authorization")):
            message = "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'"
            error = APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return _error_response(error)
        return await call_next(request)

    @app.get("/health")
    async def health():
        # Open to whoever can connect, so it names no cause: the load or the engine loop logged it when it happened.
        if state.load_error is not None:
            return JSONResponse(
                {"status": "error", "error": "the model failed to load; the server's log says why"}, 503
            )
        if state.engine is not None and not state.engine.is_healthy:
            return JSONResponse({"status": "error", "error": "the engine stopped; the server's log says why"}, 503)
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if state.engine is None or not state.engine.is_healthy:
            return JSONResponse({"status": "loading" if state.load_error is None else "error"}, 503)
        return {"status": "ready"}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/profile")
    async def profile():
        """The engine's measured pool profile: prefill tokens/s by prompt length, decode tokens/s by batch, its limits."""
        if state.profile is None:
            message = "this server measured no profile (serve --calibrate), or has not yet"
            return _error_response(APIError(404, message, "NotFoundError", code="no_profile"))
        return state.profile

    @app.get("/v1/models")
    async def models():
        card = {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "inferfleet"}
        if state.engine is not None:
            card["max_model_len"] = state.engine.engine.max_context_length  # vLLM's field name
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        engine = _serving_engine(state, body.model)
        if body.echo:
            raise APIError(400, "echo is not supported", param="echo")
        prompt_ids = await asyncio.to_thread(lambda: [_encode(engine, p) for p in body.prompts()])
        if not prompt_ids:
            raise APIError(400, "prompt must not be empty", param="prompt")
        params = _params(body.sampling_params, body.max_tokens, body.logprobs)
        fmt = CompletionFormat(state.served_model_name, engine.engine.tokenizer)
        return await _respond(engine, request, body, prompt_ids, params, fmt, state.max_request_output_tokens)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        engine = _serving_engine(state, body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        tokenizer = engine.engine.tokenizer
        # Rendering and tokenizing a large conversation takes a while: a worker thread does it, not the event loop.
        try:
            text = await asyncio.to_thread(tokenizer.apply_chat_template, messages, add_generation_prompt=True)
        except Exception as exc:  # template errors are the request's fault (e.g. unsupported roles)
            raise APIError(
                400, f"messages could not be rendered with the chat template: {exc}", param="messages"
            ) from exc
        prompt_ids = [await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=False)]
        params = _params(body.sampling_params, body.resolved_max_tokens, body.num_logprobs)
        fmt = ChatFormat(state.served_model_name, engine.engine.tokenizer)
        return await _respond(engine, request, body, prompt_ids, params, fmt, state.max_request_output_tokens)

    return app


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "json_invalid"}


def _is_type_tag(part) -> bool:
    """Whether a pydantic error location part names a union member (e.g. "list[str]"), not a field."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or part.startswith("function-"))


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, max_bytes: int):
        super().__init__(413, f"The request body is larger than this server's limit of {max_bytes} bytes.")


class BodyLimit:
    """ASGI middleware: a body over max_bytes is refused with 413, by its Content-Length before any of it is read,
    or (chunked) as soon as the bytes received pass the limit; a body is never read whole before the check."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await _error_response(APIError(413, BodyTooLarge(self.max_bytes).detail))(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)  # FastAPI passes HTTPExceptions to their handler
            return message

        await self.app(scope, limited_receive, send)


def _validation_error(errors: list[dict]) -> APIError:
    """One 400 naming the field from pydantic's errors: the first that is not a mere type mismatch of one union
    member (a lone surrogate or an over-long list says more than "Input should be a valid string")."""
    if not errors:
        return APIError(400, "invalid request body")
    first = next((e for e in errors if not e.get("type", "").endswith("_type")), errors[0])
    loc = [str(part) for part in first.get("loc", ()) if part != "body" and not _is_type_tag(part)]
    param = ".".join(loc) or None
    kind = first.get("type")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param)
    if kind == "unsupported_parameter":
        return APIError(400, f"{param} is not supported by this server", param=param, code="unsupported_parameter")
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return APIError(400, message, param=param)


def _load_engine(state: ServerState, load: Callable[[], AsyncEngine]) -> None:
    try:
        state.engine = load()
        log.info("Loaded model %s", state.served_model_name)
    except Exception as exc:
        log.exception("Loading the model failed")
        state.load_error = f"loading the model failed: {exc}"


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _serving_engine(state: ServerState, model: str) -> AsyncEngine:
    if model != state.served_model_name:
        raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model", "model_not_found")
    engine = state.engine
    if engine is None:
        raise APIError(
            503, "The model is still loading.", "ServiceUnavailable", headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    if not engine.is_healthy:
        raise APIError(503, f"The engine stopped: {engine.error!r}", "ServiceUnavailable")
    return engine


def _encode(engine: AsyncEngine, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return engine.engine.tokenizer.encode(prompt)
    vocab_size = engine.engine.runner.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param="prompt")
    return prompt


def _params(make, max_tokens, logprobs):
    try:
        return make(max_tokens, logprobs)
    except ValueError as exc:
        raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from exc


def _check_budget(params, max_tokens: list[int], limit: int) -> None:
    """A 400 for a request that may produce more than limit output tokens (SamplingParams.num_budget_tokens)."""
    num_tokens = params.num_budget_tokens(max_tokens)
    if num_tokens <= limit:
        return
    weight = f" x {params.num_held_per_token} for logprobs={params.logprobs}" if params.logprobs is not None else ""
    message = (
        f"This request may produce {num_tokens:,} output tokens ({len(max_tokens)} prompt(s) x n={params.n} x up to "
        f"{max(max_tokens):,} tokens each{weight}), over this server's limit of {limit:,} per request "
        "(--max-request-output-tokens). Lower n, max_tokens, logprobs or the number of prompts."
    )
    raise APIError(400, message, code="request_too_large")


async def _respond(
    engine: AsyncEngine, request: Request, body, prompt_ids: list[list[int]], params, fmt, max_output_tokens: int
):
    max_tokens = []
    for ids in prompt_ids:
        try:
            max_tokens.append(engine.engine.check_length(len(ids), params.max_tokens))
        except ContextLengthError as exc:
            raise APIError(
                400, str(exc), param="max_tokens" if params.max_tokens else "prompt", code="context_length_exceeded"
            ) from exc
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from exc
    _check_budget(params, max_tokens, max_output_tokens)  # before the engine sees any of it
    request_id = f"{fmt.id_prefix}-{uuid.uuid4().hex}"
    sub_ids = [f"{request_id}-{i}" for i in range(len(prompt_ids))]
    streams = []
    try:
        for sub_id, ids in zip(sub_ids, prompt_ids):
            streams.append(engine.submit(sub_id, ids, params))
    except QueueFullError as exc:
        for sub_id in sub_ids[: len(streams)]:
            engine.abort(sub_id)
        raise APIError(
            429,
            f"Too many requests are waiting ({exc}); retry later.",
            "RateLimitError",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from exc
    except EngineDeadError as exc:
        raise APIError(503, str(exc), "ServiceUnavailable") from exc
    merged = _merge(streams, params.n)
    if body.stream:
        return StreamingResponse(
            _sse(fmt, request_id, merged, body.include_usage, params.n), media_type="text/event-stream"
        )
    collect = asyncio.ensure_future(_collect(merged, len(prompt_ids) * params.n))
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    await asyncio.wait({collect, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if not collect.done():  # the client left: abort, which frees the request's blocks
        collect.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collect
        return Response(status_code=499)
    watcher.cancel()
    try:
        choices, num_prompt, num_completion = collect.result()
    except EngineDeadError as exc:
        raise APIError(503, str(exc), "ServiceUnavailable") from exc
    except RequestFailedError as exc:  # its batch failed; the engine serves on
        raise APIError(500, str(exc), "server_error") from exc
    except ValueError as exc:  # refused by the engine itself
        raise APIError(400, str(exc)) from exc
    return fmt.response(request_id, choices, num_prompt, num_completion)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _merge(streams: list[AsyncIterator[RequestOutput]], n: int) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several requests as (choice offset, output); closing it aborts every request still running."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(offset: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    await queue.put((offset, out))
            await queue.put((offset, None))
        except Exception as exc:
            await queue.put((offset, exc))

    tasks = [asyncio.ensure_future(pump(i * n, s)) for i, s in enumerate(streams)]
    try:
        num_done = 0
        while num_done < len(tasks):
            offset, item = await queue.get()
            if item is None:
                num_done += 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield offset, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(merged, num_choices: int) -> tuple[list[CompletionOutput], int, int]:
    choices = [CompletionOutput(i) for i in range(num_choices)]
    num_prompt = {}
    async with contextlib.aclosing(merged):
        async for offset, out in merged:
            num_prompt[offset] = out.num_prompt_tokens
            for delta in out.outputs:
                choices[offset + delta.index].extend(delta)
    return choices, sum(num_prompt.values()), sum(len(c.token_ids) for c in choices)


async def _sse(fmt, request_id: str, merged, include_usage: bool, n: int) -> AsyncIterator[str]:
    num_prompt: dict[int, int] = {}
    num_completion = 0
    started: set[int] = set()
    try:
        async with contextlib.aclosing(merged):
            async for offset, out in merged:
                num_prompt[offset] = out.num_prompt_tokens
                for delta in out.outputs:
                    index = offset + delta.index
                    num_completion += len(delta.token_ids)
                    if index not in started:
                        started.add(index)
                        first = fmt.first_chunk(request_id, index)
                        if first is not None:
                            yield _event(first, include_usage)
                    if delta.text or delta.logprobs or delta.finish_reason:
                        yield _event(fmt.chunk(request_id, index, delta), include_usage)
    except Exception as exc:  # headers are sent already: report in-band, then end the stream
        log.warning("Stream %s failed: %s", request_id, exc)
        yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'server_error', 'param': None, 'code': None}})}\n\n"
    else:
        if include_usage:
            totals = usage(sum(num_prompt.values()), num_completion)
            yield f"data: {json.dumps(fmt.usage_chunk(request_id, totals))}\n\n"
    yield "data: [DONE]\n\n"


def _event(chunk: dict, include_usage: bool) -> str:
    if include_usage:
        chunk["usage"] = None
    return f"data: {json.dumps(chunk)}\n\n"
