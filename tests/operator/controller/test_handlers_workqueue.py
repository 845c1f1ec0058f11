"""The work queue behind every handler: one reconcile per key at a time, coalescing, retry delays."""

import asyncio

import pytest

from inferfleet_operator.controller.workqueue import WorkQueue


class Requeue(Exception):
    """An error with a `delay`, as kopf.TemporaryError has: retried after that delay."""

    def __init__(self, delay: float):
        super().__init__(f"requeued after {delay:g}s")
        self.delay = delay


async def _until(predicate, what: str, timeout: float = 5.0) -> None:
    """Waits, on the running loop, until predicate() holds; fails naming `what` after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.005)


def test_triggers_within_the_debounce_window_run_one_reconcile():
    runs = []

    async def work(key):
        runs.append(key)

    async def go():
        queue = WorkQueue(work, debounce=0.05)
        queue.start()
        for _ in range(20):
            queue.enqueue("a")
        queue.enqueue("b")
        await _until(lambda: len(runs) >= 2 and queue.is_idle, "both keys run and the queue idle")
        await queue.stop()

    asyncio.run(go())
    assert sorted(runs) == ["a", "b"]


def test_a_key_is_never_reconciled_twice_at_once_and_a_trigger_while_running_runs_again():
    running = set()
    overlaps = []
    runs = []

    async def work(key):
        if key in running:
            overlaps.append(key)
        running.add(key)
        runs.append(key)
        await asyncio.sleep(0.05)
        running.discard(key)

    async def go():
        queue = WorkQueue(work, debounce=0.0)
        queue.start()
        queue.enqueue("a")
        await asyncio.sleep(0.02)  # first run in progress
        queue.enqueue("a")
        queue.enqueue("a")
        await _until(lambda: len(runs) >= 2 and queue.is_idle, "the second run and the queue idle")
        await queue.stop()

    asyncio.run(go())
    assert overlaps == []
    assert runs == ["a", "a"]


def test_a_returned_delay_runs_the_reconcile_again_after_it():
    times = []

    async def work(key):
        times.append(asyncio.get_running_loop().time())
        return 0.1 if len(times) == 1 else None

    async def go():
        queue = WorkQueue(work, debounce=0.0)
        queue.start()
        queue.enqueue("a")
        await _until(lambda: len(times) >= 2 and queue.is_idle, "the delayed second run")
        await queue.stop()

    asyncio.run(go())
    assert len(times) == 2
    assert times[1] - times[0] == pytest.approx(0.1, abs=0.05)


def test_failures_retry_with_growing_delays_and_requeue_uses_its_own_delay():
    times = {"fail": [], "wait": []}
    errors = []

    async def work(key):
        times[key].append(asyncio.get_running_loop().time())
        if key == "fail" and len(times[key]) < 3:
            raise RuntimeError("boom")
        if key == "wait" and len(times[key]) < 2:
            raise Requeue(0.15)

    async def go():
        queue = WorkQueue(
            work,
            debounce=0.0,
            error_delays=(0.05, 0.2),
            on_error=lambda key, error: errors.append((key, type(error).__name__)),
        )
        queue.start()
        queue.enqueue("fail")
        queue.enqueue("wait")
        await _until(
            lambda: len(times["fail"]) >= 3 and len(times["wait"]) >= 2 and queue.is_idle,
            "three runs of 'fail', two of 'wait'",
        )
        await queue.stop()

    asyncio.run(go())
    fail = times["fail"]
    assert len(fail) == 3
    assert fail[1] - fail[0] == pytest.approx(0.05, abs=0.04)
    assert fail[2] - fail[1] == pytest.approx(0.2, abs=0.06)
    wait = times["wait"]
    assert len(wait) == 2 and wait[1] - wait[0] == pytest.approx(0.15, abs=0.05)
    assert ("fail", "RuntimeError") in errors and ("wait", "Requeue") in errors


def test_a_forgotten_key_does_not_run():
    runs = []

    async def work(key):
        runs.append(key)

    async def go():
        queue = WorkQueue(work, debounce=0.05)
        queue.start()
        queue.enqueue("gone")
        queue.forget("gone")
        # A witness due after gone's debounce window: once it ran, gone's turn has passed.
        queue.enqueue("witness", 0.1)
        await _until(lambda: "witness" in runs and queue.is_idle, "the witness key's run")
        await queue.stop()

    asyncio.run(go())
    assert runs == ["witness"]


def test_fast_keys_take_the_next_free_slot_ahead_of_a_backlog_and_concurrency_holds():
    runs, running, most = [], set(), [0]

    async def work(key):
        running.add(key)
        most[0] = max(most[0], len(running))
        runs.append(key)
        await asyncio.sleep(0.01)
        running.discard(key)

    async def go():
        queue = WorkQueue(work, concurrency=2, debounce=0.0)
        queue.start()
        for i in range(10):
            queue.enqueue(f"slow-{i}")
        await asyncio.sleep(0.005)  # the first two run, eight wait for a slot
        queue.enqueue("ready", fast=True)
        queue.enqueue("slow-9", fast=True)  # already waiting: moves ahead
        await _until(lambda: len(runs) >= 11 and queue.is_idle, "all eleven keys run")
        await queue.stop()

    asyncio.run(go())
    assert sorted(runs) == sorted([f"slow-{i}" for i in range(10)] + ["ready"])
    assert runs[2:4] == ["slow-9", "ready"], runs
    assert most[0] == 2


def test_only_a_change_in_a_deployments_ready_replicas_asks_for_the_fast_lane():
    from types import SimpleNamespace

    from inferfleet_operator.controller.handlers import _readiness_changed

    memo = SimpleNamespace(ready_replicas={})

    def deployment(ready=None):
        status = {} if ready is None else {"readyReplicas": ready}
        return {"metadata": {"namespace": "ns", "name": "d"}, "status": status}

    assert not _readiness_changed(memo, "ADDED", deployment())  # created: nothing ready yet
    assert not _readiness_changed(memo, "MODIFIED", deployment(0))
    assert _readiness_changed(memo, "MODIFIED", deployment(1))
    assert not _readiness_changed(memo, "MODIFIED", deployment(1))  # status churn, same count
    assert _readiness_changed(memo, "DELETED", deployment(1))
    assert memo.ready_replicas == {}


def test_a_child_event_counts_as_a_change_only_when_its_metadata_or_spec_moved():
    from types import SimpleNamespace

    from inferfleet_operator.controller.handlers import _content_changed

    memo = SimpleNamespace(child_contents={})

    def child(rv, generation=None, replicas=1, ready=0, labels=None, annotations=None, name="d"):
        meta = {"namespace": "ns", "name": name, "uid": "u", "resourceVersion": str(rv)}
        meta.update(managedFields=[{"manager": str(rv)}], labels=labels or {"app": "a"}, annotations=annotations or {})
        if generation is not None:
            meta["generation"] = generation
        return {"kind": "Deployment", "metadata": meta, "spec": {"replicas": replicas}, "status": {"ready": ready}}

    # A kind that keeps metadata.generation (Deployment, PDB): the generation stands for the spec.
    assert _content_changed(memo, "ADDED", child(1, generation=1))
    assert not _content_changed(memo, "MODIFIED", child(2, generation=1, ready=1))  # its controller's status write
    revision = {"deployment.kubernetes.io/revision": "1"}
    assert not _content_changed(memo, "MODIFIED", child(3, generation=1, annotations=revision))  # the controller's
    assert _content_changed(memo, "MODIFIED", child(4, generation=2, replicas=3))  # scaled by hand: drift
    assert _content_changed(memo, "MODIFIED", child(5, generation=2, replicas=3, labels={"app": "b"}))
    assert _content_changed(memo, "MODIFIED", child(6, generation=2, replicas=3, annotations={"note": "x"}))
    assert _content_changed(memo, "DELETED", child(7, generation=2))
    assert memo.child_contents == {}
    # A kind without it (a Service): the spec itself is compared.
    assert _content_changed(memo, "ADDED", child(8, name="s"))
    assert not _content_changed(memo, "MODIFIED", child(9, name="s", ready=1))
    assert _content_changed(memo, "MODIFIED", child(10, name="s", replicas=2))
