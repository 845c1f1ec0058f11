"""build_app: the router's HTTP server (aiohttp): the OpenAI endpoints through Router, /v1/models merged from the
ready endpoints, its own /health, /ready and /metrics, and the scraper running beside them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aiohttp
import httpx
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from inferfleet_operator.plan.endpoint_picker import EndpointPicker
from inferfleet_operator.router.bodies import CHAT, COMPLETIONS, parse_body
from inferfleet_operator.router.config import RouterConfig
from inferfleet_operator.router.endpoints import EndpointSource, EndpointTable, source_for
from inferfleet_operator.router.errors import RouterError, error_response, unavailable
from inferfleet_operator.router.metrics import RouterMetrics
from inferfleet_operator.router.profiles import PoolProfiles
from inferfleet_operator.router.proxy import Router
from inferfleet_operator.router.scrape import scrape_forever

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})  # probes and the scraper: never behind a key
MAX_MODELS_BYTES = 1 << 20  # a pod's /v1/models answer is a few hundred bytes
ROUTER_KEY = web.AppKey("router", Router)

log = logging.getLogger(__name__)


def build_app(
    config: RouterConfig, picker: EndpointPicker | None = None, source: EndpointSource | None = None
) -> web.Application:
    """The app over the config's endpoints (or source's), choosing with picker (a fresh EndpointPicker if None)."""
    table = EndpointTable(PoolProfiles(config.profiles))
    router = Router(config, table, picker or EndpointPicker(), RouterMetrics())
    return create_app(router, source or source_for(config))


def create_app(router: Router, source: EndpointSource) -> web.Application:
    config, metrics = router.config, router.metrics

    @web.middleware
    async def errors_and_keys(request: web.Request, handler):
        try:
            guarded = request.path not in OPEN_PATHS and config.api_keys is not None
            if guarded and not config.api_keys.allows(request.headers.get("Authorization")):
                message = "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'"
                raise RouterError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)
        except RouterError as error:
            metrics.rejected.labels(str(error.status)).inc()
            return error_response(error)
        except web.HTTPException as exc:  # routing (404, 405): in the same shape as every other error
            if exc.status < 400:
                raise
            return error_response(RouterError(exc.status, exc.reason))

    async def openai(request: web.Request) -> web.StreamResponse:
        body = await _read_body(request, config.max_body_bytes)
        return await router.forward(request, parse_body(request.path, body))

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(await _merged_models(router))

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(_request: web.Request) -> web.Response:
        num_ready = len(router.table.pickable())
        if num_ready == 0:
            return web.json_response({"status": "no endpoint is ready"}, status=503)
        return web.json_response({"status": "ready", "num_ready_endpoints": num_ready})

    async def metrics_page(_request: web.Request) -> web.Response:
        for state in router.table.states():
            metrics.ready.labels(state.spec.url, state.spec.pool).set(int(state.is_ready and state.metrics is not None))
        profiles = router.table.profiles
        metrics.pool_decode_rate.clear()  # a pool's source changes, and pools leave
        for pool in sorted({state.spec.pool for state in router.table.states()}):
            decode = profiles.profile_for(pool).decode
            metrics.pool_decode_rate.labels(pool, profiles.source(pool)).set(decode[-1][1] if decode else 0.0)
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def background(_app: web.Application):
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        router.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        # The scraper reads with the autoscaler's httpx reader (controller.scrape), so it has a client of its own.
        headers = {k: v for k, v in router.upstream_headers.items() if k == "Authorization"}
        scrape_http = httpx.AsyncClient(timeout=config.scrape_timeout_s, headers=headers, trust_env=False)
        args = (router.table, source, config.scrape_interval_s, config.scrape_timeout_s, router.clock)
        scraper = asyncio.create_task(scrape_forever(scrape_http, *args))
        yield
        scraper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scraper
        await scrape_http.aclose()
        await router.session.close()

    app = web.Application(middlewares=[errors_and_keys])
    app[ROUTER_KEY] = router
    app.router.add_post(COMPLETIONS, openai)
    app.router.add_post(CHAT, openai)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_page)
    app.cleanup_ctx.append(background)
    return app


async def _read_body(request: web.Request, max_bytes: int) -> bytes:
    """The body, refused with 413 by its Content-Length before any of it is read, or once more than max_bytes came."""
    message = f"The request body is larger than this server's limit of {max_bytes} bytes."
    if request.content_length is not None and request.content_length > max_bytes:
        raise RouterError(413, message)
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > max_bytes:
            raise RouterError(413, message)
    return bytes(body)


async def _merged_models(router: Router) -> dict:
    """Every ready endpoint's models, each id once; 503 when none answered."""
    endpoints = router.table.pickable()
    if not endpoints:
        raise unavailable("No endpoint is ready", "no_endpoint")
    answers = await asyncio.gather(*(_models_of(router, e.address) for e in endpoints), return_exceptions=True)
    cards: dict[str, dict] = {}
    for answer in answers:
        for card in answer if isinstance(answer, list) else ():
            if isinstance(card, dict) and isinstance(card.get("id"), str):
                cards.setdefault(card["id"], card)
    if not cards:
        raise unavailable("No ready endpoint listed its models", "no_endpoint")
    return {"object": "list", "data": list(cards.values())}


async def _models_of(router: Router, address: str) -> list:
    assert router.session is not None
    timeout = aiohttp.ClientTimeout(total=router.config.scrape_timeout_s)
    headers = router.upstream_headers
    async with router.session.get(f"{address}/v1/models", headers=headers, timeout=timeout) as response:
        if response.status != 200:
            return []
        body = bytearray()
        while chunk := await response.content.readany():
            body += chunk
            if len(body) > MAX_MODELS_BYTES:
                return []
        answer = json.loads(body)
        data = answer.get("data") if isinstance(answer, dict) else None
        return data if isinstance(data, list) else []
