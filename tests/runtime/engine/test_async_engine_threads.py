"""The CPU engine thread uses every core while OpenMP workers sleep when idle, one fewer when they spin, and
OMP_NUM_THREADS when set; importing the runtime makes idle OpenMP workers sleep unless the user chose otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferfleet_runtime import device

RUNTIME_ROOT = Path(device.__file__).resolve().parents[1]


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(8)))


def test_cpu_engine_threads_use_every_core_when_openmp_workers_sleep(eight_cores, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert device.cpu_engine_threads() == 8


def test_cpu_engine_threads_leave_one_core_for_the_event_loop_when_workers_spin(eight_cores, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert device.cpu_engine_threads() == 7
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0})
    assert device.cpu_engine_threads() == 1


def test_cpu_engine_threads_follow_omp_num_threads_when_set(eight_cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert device.cpu_engine_threads() == 3


def _wait_policy_after_import(env: dict) -> str:
    code = "import os, inferfleet_runtime; print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(RUNTIME_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_importing_the_runtime_makes_idle_openmp_workers_sleep_unless_the_user_chose():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _wait_policy_after_import(env) == "PASSIVE"
    assert _wait_policy_after_import({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
