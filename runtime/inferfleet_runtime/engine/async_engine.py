"""AsyncEngine: runs LLMEngine in a background thread and streams each request's outputs to asyncio.

The engine thread never waits on HTTP (outputs are handed over with call_soon_threadsafe) and HTTP
handlers never wait on the engine (adds and aborts are queued commands applied between steps).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator

from inferfleet_runtime.engine.llm_engine import EngineStats, LLMEngine, RequestOutput, StepError
from inferfleet_runtime.engine.metrics import ServerMetrics
from inferfleet_runtime.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5
# Steps in a row that may fail before the engine counts as broken (/health then answers 503, so the liveness
# probe restarts the pod): one bad batch fails its own requests, a device that fails every batch stops the engine.
MAX_FAILED_STEPS_IN_A_ROW = 3


class QueueFullError(RuntimeError):
    """More requests are waiting than the configured queue length."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an error; the server cannot serve."""


class RequestFailedError(RuntimeError):
    """The engine failed while running a batch that held this request; the engine itself goes on."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue_len: int, metrics: ServerMetrics | None = None):
        self.engine = engine
        self.max_queue_len = max_queue_len
        self.metrics = metrics
        self.stats: EngineStats = engine.stats()  # snapshot, replaced after every step
        self.error: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = False
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._num_pending_adds = 0
        self._thread = threading.Thread(target=self._run, name="inferfleet-engine", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout=10)

    @property
    def is_healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    # -- requests (called from the event loop) ------------------------------------------------------
    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Queues a request (refusing it when the queue is full) and returns the iterator of its outputs.

        Closing the iterator before the request finishes aborts it; so does abort().
        """
        if not self.is_healthy:
            raise EngineDeadError(f"the engine stopped: {self.error!r}")
        with self._lock:
            if self.stats.num_waiting + self._num_pending_adds >= self.max_queue_len:
                raise QueueFullError(f"{self.max_queue_len} requests are already waiting")
            self._num_pending_adds += 1
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        arrival = time.monotonic()
        self._send(("add", request_id, prompt_ids, params, arrival))
        return self._outputs(request_id, outputs, arrival)

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._send(("abort", request_id))

    async def _outputs(self, request_id: str, outputs: asyncio.Queue, arrival: float) -> AsyncIterator[RequestOutput]:
        last_token_time = None
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                self._observe(item, arrival, last_token_time)
                if any(choice.token_ids for choice in item.outputs):
                    last_token_time = time.monotonic()
                yield item
        finally:
            if not finished:
                self.abort(request_id)
            self._streams.pop(request_id, None)

    def _observe(self, out: RequestOutput, arrival: float, last_token_time: float | None) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        num_new = sum(len(choice.token_ids) for choice in out.outputs)
        if num_new:
            self.metrics.count_generated(num_new)
            if last_token_time is None:
                self.metrics.observe_first_token(now - arrival)
            else:
                self.metrics.observe_inter_token(now - last_token_time)
        if out.finished:
            self.metrics.observe_finished(now - arrival, out.num_prompt_tokens)

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # -- the engine thread --------------------------------------------------------------------------
    def _run(self) -> None:
        device = getattr(self.engine.runner, "device", None)
        if getattr(device, "type", None) == "cpu":
            import torch

            from inferfleet_runtime.device import cpu_engine_threads

            # Per thread: this is the thread that runs the model. Tensor-parallel ranks share the cores.
            tp = getattr(self.engine.runner, "tensor_parallel", None)
            torch.set_num_threads(max(1, cpu_engine_threads() // (tp.world if tp else 1)))
        failed_in_a_row = 0
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._publish_stats()
                    self._wakeup.wait(IDLE_WAIT_S)
                    self._wakeup.clear()
                    continue
                try:
                    outputs = self.engine.step()
                except StepError as exc:
                    failed_in_a_row += 1
                    if failed_in_a_row >= MAX_FAILED_STEPS_IN_A_ROW:
                        raise
                    self._fail_requests(exc)
                    continue
                failed_in_a_row = 0
                self._publish_stats()
                self._deliver_all(outputs)
        except BaseException as exc:  # the loop must report why it died to every waiting client
            log.exception("Engine loop stopped on an error")
            self.error = exc
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError(f"the engine stopped: {exc!r}"))

    def _fail_requests(self, exc: StepError) -> None:
        """Ends the requests of a failed batch (their blocks are freed) and tells their clients why."""
        log.error("Failed %d request(s) whose batch raised %r; the engine goes on", len(exc.request_ids), exc.cause)
        for request_id in exc.request_ids:
            self.engine.abort_request(request_id)
            self._deliver(
                request_id, RequestFailedError(f"the engine failed while running this request: {exc.cause!r}")
            )
        self._publish_stats()

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, prompt_ids, params, arrival = command
                with self._lock:
                    self._num_pending_adds -= 1
                if request_id not in self._streams:  # the client left before the engine saw it
                    continue
                try:
                    self.engine.add_request(request_id, prompt_ids, params, arrival)
                except ValueError as exc:
                    self._deliver(request_id, exc)
            else:
                self.engine.abort_request(command[1])

    def _publish_stats(self) -> None:
        with self._lock:
            self.stats = self.engine.stats()
        if self.metrics is not None:
            s = self.stats
            self.metrics.observe_engine(s.num_waiting, s.num_running, s.kv_cache_usage, s.num_preemptions)

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        """Hands a step's outputs over with one wake-up per event loop, not one per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((stream[1], out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the event loop has closed
                pass

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        loop, outputs = stream
        try:
            loop.call_soon_threadsafe(outputs.put_nowait, item)
        except RuntimeError:  # the event loop has closed
            pass


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for outputs, item in items:
        outputs.put_nowait(item)
