"""Router.forward: a checked request sent to the endpoint the picker chooses, sent again to another while nothing
has reached the client, and relayed back; a stream that breaks after that ends with an error event and [DONE]."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from inferfleet_operator.plan.endpoint_picker import REASON_NONE_FITS, Endpoint, EndpointPicker, PickRequest
from inferfleet_operator.router.accounting import Flight, Ledger
from inferfleet_operator.router.bodies import RoutedRequest
from inferfleet_operator.router.config import FAIL_CLOSE, RouterConfig
from inferfleet_operator.router.endpoints import EndpointTable
from inferfleet_operator.router.errors import RouterError, sse_error_event, unavailable
from inferfleet_operator.router.metrics import RouterMetrics
from inferfleet_operator.router.sse import TAIL_BYTES, EventSplitter, completion_tokens

REASON_PICKER_FAILED = "PickerFailed"
RETRY_STATUSES = frozenset({429, 503})  # the pod did not admit the request (queue full, loading): another may
COPIED_HEADERS = ("Content-Type", "Retry-After", "X-Request-Id")
# What ends an attempt on the upstream side (a write to a departed client raises a ClientError too: kept apart).
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, ValueError)

ENDPOINT_POLL_S = 0.05  # how often a request waiting for an endpoint looks again

log = logging.getLogger(__name__)


class UpstreamFailed(Exception):
    """An attempt ended before anything reached the client: the request may go to another endpoint."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "connect": no answer (refused, reset, closed, timed out); "status": 429 or 503


class Router:
    def __init__(
        self,
        config: RouterConfig,
        table: EndpointTable,
        picker: EndpointPicker,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.table, self.picker, self.metrics, self.clock = config, table, picker, metrics, clock
        self.ledger = Ledger(picker)
        self.session: aiohttp.ClientSession | None = None  # opened on the app's loop (app.py)
        self._num_picks = 0
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if config.upstream_api_key:
            self._headers["Authorization"] = f"Bearer {config.upstream_api_key}"

    @property
    def upstream_headers(self) -> dict[str, str]:
        return dict(self._headers)

    def choose(self, pick: PickRequest, tried: set[str]) -> tuple[Endpoint, Flight]:
        """The picker's endpoint among those not tried yet, its send recorded; RouterError when there is none."""
        endpoints = [e for e in self.table.endpoints() if e.address not in tried]
        if endpoints:  # the picker takes the first of equals: turning the list spreads ties round-robin
            turn = self._num_picks % len(endpoints)
            endpoints = endpoints[turn:] + endpoints[:turn]
        self._num_picks += 1
        now = self.clock()
        try:
            decision = self.picker.pick(pick, endpoints, now)
        except Exception:
            log.exception("The endpoint picker failed (failure mode %s)", self.config.failure_mode)
            self.metrics.decisions.labels(REASON_PICKER_FAILED).inc()
            ready = [e for e in self.table.pickable() if e.address not in tried]
            if self.config.failure_mode == FAIL_CLOSE or not ready:
                raise unavailable("The endpoint picker failed and no endpoint was chosen", "picker_failed") from None
            endpoint = min(ready, key=lambda e: self.ledger.num_in_flight(e.address))
            return endpoint, self.ledger.start(endpoint.address, pick, now, is_recorded=False)
        self.metrics.decisions.labels(decision.reason).inc()
        if decision.endpoint is None:
            if decision.reason == REASON_NONE_FITS:
                message = "The prompt and max_tokens are more than any endpoint's KV cache holds"
                raise RouterError(400, message, param="max_tokens", code="context_length_exceeded")
            raise unavailable(f"No endpoint can take the request now ({decision.reason})", "no_endpoint")
        return decision.endpoint, self.ledger.start(decision.endpoint.address, pick, now, is_recorded=True)

    async def forward(self, request: web.Request, routed: RoutedRequest) -> web.StreamResponse:
        tried: set[str] = set()
        last_error = ""
        waited_until = time.monotonic() + self.config.endpoint_wait_s
        while not self.table.pickable() and time.monotonic() < waited_until:  # a pool's only pod being replaced
            await asyncio.sleep(ENDPOINT_POLL_S)
        for attempt in range(self.config.max_attempts):
            try:
                endpoint, flight = self.choose(routed.pick, tried)
            except RouterError as error:
                if not tried or error.status != 503:
                    raise
                raise unavailable(f"Every endpoint tried failed; the last: {last_error}", "upstream_failed") from None
            tried.add(endpoint.address)
            labels = (endpoint.address, endpoint.pool)
            self.metrics.routed.labels(*labels).inc()
            self.metrics.in_flight.labels(*labels).inc()
            if attempt:
                self.metrics.retries.inc()
            try:
                is_last = attempt + 1 == self.config.max_attempts
                upstream, first, splitter = await self._open(endpoint.address, request.path, routed.body, is_last)
                flight.has_first_byte = True
                if splitter is not None:
                    return await self._relay_stream(request, upstream, first, splitter, flight, labels)
                return await self._relay_body(request, upstream, first, flight)
            except UpstreamFailed as failure:
                self.metrics.upstream_errors.labels(*labels, failure.kind).inc()
                if failure.kind == "connect":
                    self.table.mark_down(endpoint.address)
                log.warning("Request to %s failed before its first byte: %s", endpoint.address, failure)
                last_error = f"{endpoint.address}: {failure}"
            finally:
                self.metrics.in_flight.labels(*labels).dec()
                self.metrics.output_tokens.labels(*labels).inc(flight.num_generated)
                self.ledger.finish(flight)
        raise unavailable(f"Every endpoint tried failed; the last: {last_error}", "upstream_failed")

    async def _open(
        self, address: str, path: str, body: bytes, is_last: bool
    ) -> tuple[aiohttp.ClientResponse, bytes, EventSplitter | None]:
        """The upstream response and its first bytes (whole events for a stream); UpstreamFailed before them."""
        assert self.session is not None
        try:
            upstream = await self.session.post(address + path, data=body, headers=self._headers)
        except UPSTREAM_ERRORS as exc:
            raise UpstreamFailed("connect", f"no answer: {exc!r}") from None
        try:
            if upstream.status in RETRY_STATUSES and not is_last:
                raise UpstreamFailed("status", f"answered {upstream.status}")
            is_stream = upstream.content_type == "text/event-stream"
            splitter = EventSplitter() if is_stream else None
            first = b""
            while not first:
                chunk = await upstream.content.readany()
                if not chunk:
                    break
                first = splitter.feed(chunk) if splitter is not None else chunk
            if splitter is not None and not first:
                raise UpstreamFailed("connect", "the stream ended before its first event")
            return upstream, first, splitter
        except UPSTREAM_ERRORS as exc:
            upstream.close()
            raise UpstreamFailed("connect", f"the answer broke before its first byte: {exc!r}") from None
        except BaseException:  # UpstreamFailed, or the client left (the handler is cancelled): the pod must see it
            upstream.close()
            raise

    def _response(self, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        headers = {name: upstream.headers[name] for name in COPIED_HEADERS if name in upstream.headers}
        return web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        splitter: EventSplitter,
        flight: Flight,
        labels: tuple[str, str],
    ) -> web.StreamResponse:
        response = self._response(upstream)
        response.headers["Cache-Control"] = "no-cache"
        is_clean = False
        try:
            await response.prepare(request)
            events, broken = first, ""
            while True:
                if events:
                    flight.num_generated = splitter.num_generated
                    await response.write(events)  # the client gone: this raises, and the upstream is closed below
                if splitter.is_done:
                    break
                try:
                    chunk = await upstream.content.readany()
                    if not chunk:
                        broken = "the pod closed the stream before [DONE]"
                        break
                    events = splitter.feed(chunk)
                except UPSTREAM_ERRORS as exc:
                    broken = f"the pod's stream broke: {exc!r}"
                    break
            if broken:
                self.metrics.upstream_errors.labels(*labels, "stream").inc()
                log.warning("Stream from %s broke after its first byte: %s", flight.address, broken)
                await response.write(sse_error_event(f"The serving pod failed mid-stream: {broken}"))
            await response.write_eof()
            is_clean = not broken and await _read_to_end(upstream)
            return response
        finally:
            _done_with(upstream, is_clean)

    async def _relay_body(
        self, request: web.Request, upstream: aiohttp.ClientResponse, first: bytes, flight: Flight
    ) -> web.StreamResponse:
        response = self._response(upstream)
        if upstream.content_length is not None:
            response.content_length = upstream.content_length
        is_clean = False
        try:
            await response.prepare(request)
            tail, chunk = b"", first
            while chunk:
                tail = (tail + chunk)[-TAIL_BYTES:]
                await response.write(chunk)
                try:
                    chunk = await upstream.content.readany()
                except UPSTREAM_ERRORS as exc:
                    # Headers and part of the body are sent: cutting the connection is the only way left to say so.
                    log.warning("Answer from %s broke after its first byte: %r", flight.address, exc)
                    if request.transport is not None:
                        request.transport.close()
                    return response
            if upstream.status == 200:
                flight.num_generated = completion_tokens(tail)
            await response.write_eof()
            is_clean = True
            return response
        finally:
            _done_with(upstream, is_clean)


def _done_with(upstream: aiohttp.ClientResponse, is_clean: bool) -> None:
    """A connection read to the end goes back to the pool; any other is closed, so the pod sees the client leave."""
    if is_clean:
        upstream.release()
    else:
        upstream.close()


async def _read_to_end(upstream: aiohttp.ClientResponse) -> bool:
    """Whether the body ends within a few more bytes (after [DONE], only the chunked body's terminator is left)."""
    num_bytes = 0
    try:
        while chunk := await upstream.content.readany():
            num_bytes += len(chunk)
            if num_bytes > TAIL_BYTES:
                return False
    except UPSTREAM_ERRORS:
        return False
    return True
