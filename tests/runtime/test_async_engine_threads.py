"""The CPU engine thread leaves one core to the event loop unless OMP_NUM_THREADS says otherwise."""

from __future__ import annotations

from inferfleet_runtime import async_engine


def test_cpu_engine_threads_leave_one_core_for_the_event_loop(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(async_engine.os, "cpu_count", lambda: 8)
    assert async_engine.cpu_engine_threads() == 7
    monkeypatch.setattr(async_engine.os, "cpu_count", lambda: 1)
    assert async_engine.cpu_engine_threads() == 1


def test_cpu_engine_threads_follow_omp_num_threads_when_set(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(async_engine.os, "cpu_count", lambda: 8)
    assert async_engine.cpu_engine_threads() == 3
