"""A keyed work queue: one reconcile at a time per object, triggers coalesced, retries delayed."""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence


class WorkQueue:
    """Runs `work(key)` for enqueued keys, like a controller-runtime workqueue.

    A key is never reconciled twice at once; a key enqueued while its reconcile runs runs once more
    afterwards. Due keys wait for one of `concurrency` slots in two lanes: keys enqueued with
    `fast=True` (a change that may finish a rollout, such as a Deployment's readiness) take the next
    free slot ahead of the others, so they do not queue behind a backlog of first reconciles.
    `work` returns None or seconds until it wants to run again. An exception with a `delay`
    attribute (kopf.TemporaryError) retries after that delay; any other exception retries
    after the next of `error_delays`, which reset on success.
    """

    def __init__(
        self,
        work: Callable[[Hashable], Awaitable[float | None]],
        *,
        concurrency: int = 8,
        debounce: float = 0.2,
        error_delays: Sequence[float] = (1, 2, 5, 10, 30, 60),
        on_error: Callable[[Hashable, BaseException], None] | None = None,
        logger: logging.Logger | None = None,
    ):
        self._work = work
        self._debounce = debounce
        self._error_delays = tuple(error_delays) or (1.0,)
        self._on_error = on_error
        self._logger = logger or logging.getLogger(__name__)
        self._concurrency = max(1, concurrency)
        self._due: dict[Hashable, float] = {}  # key -> loop time when it should run
        self._heap: list[tuple[float, int, Hashable]] = []
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()  # enqueued while running
        self._fast: set[Hashable] = set()  # due or pending keys in the fast lane
        self._waiting: dict[Hashable, int] = {}  # due, waiting for a slot -> its entry in _ready
        self._ready: list[tuple[int, int, Hashable]] = []  # (lane, order, key); lane 0 is fast
        self._failures: dict[Hashable, int] = {}
        self._counter = 0
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._due) + len(self._again) + len(self._waiting)

    @property
    def is_idle(self) -> bool:
        return not self._due and not self._running and not self._again and not self._waiting

    def enqueue(self, key: Hashable, delay: float | None = None, *, fast: bool = False) -> None:
        """Asks for a reconcile of `key` in `delay` seconds (default: the debounce window); `fast`
        puts it in the fast lane once due."""
        loop = asyncio.get_running_loop()
        when = loop.time() + (self._debounce if delay is None else max(0.0, delay))
        if fast:
            self._fast.add(key)
        if key in self._waiting:
            if fast:  # already due: move it ahead of the normal lane
                self._push_ready(key)
                self._wakeup.set()
            return
        if key in self._running and (delay is None or delay <= self._debounce):
            self._again.add(key)
            return
        if key in self._due and self._due[key] <= when:
            return  # already due sooner
        self._due[key] = when
        self._counter += 1
        heapq.heappush(self._heap, (when, self._counter, key))
        self._wakeup.set()

    def forget(self, key: Hashable) -> None:
        """Drops a pending reconcile (the object is gone)."""
        self._due.pop(key, None)
        self._again.discard(key)
        self._failures.pop(key, None)
        self._fast.discard(key)
        self._waiting.pop(key, None)

    def _push_ready(self, key: Hashable) -> None:
        self._counter += 1
        self._waiting[key] = self._counter
        heapq.heappush(self._ready, (0 if key in self._fast else 1, self._counter, key))

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._dispatch())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            now = loop.time()
            while self._heap and self._heap[0][0] <= now:
                when, _, key = heapq.heappop(self._heap)
                if self._due.get(key) != when:
                    continue  # superseded by an earlier enqueue, or forgotten
                del self._due[key]
                if key in self._running:
                    self._again.add(key)
                    continue
                self._push_ready(key)
            while self._ready and len(self._running) < self._concurrency:
                _, order, key = heapq.heappop(self._ready)
                if self._waiting.get(key) != order:
                    continue  # moved to the fast lane, or forgotten
                del self._waiting[key]
                self._fast.discard(key)
                self._running.add(key)
                task = loop.create_task(self._run(key))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            timeout = self._heap[0][0] - now if self._heap else None
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                pass

    async def _run(self, key: Hashable) -> None:
        delay: float | None = None
        try:
            delay = await self._work(key)
            self._failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # every failure is retried; the reconcile logged details
            if self._on_error:
                self._on_error(key, error)
            retry = getattr(error, "delay", None)
            if retry is None:
                num_failures = self._failures.get(key, 0)
                self._failures[key] = num_failures + 1
                retry = self._error_delays[min(num_failures, len(self._error_delays) - 1)]
            delay = float(retry)
        finally:
            self._running.discard(key)
            self._wakeup.set()  # a slot is free
        if key in self._again:
            self._again.discard(key)
            self.enqueue(key, 0.0 if delay is None else min(delay, self._debounce))
        if delay is not None:
            self.enqueue(key, delay)
