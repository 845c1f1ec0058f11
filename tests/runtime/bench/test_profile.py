"""`inferfleet-runtime profile` measures a pool profile on the paged engine that the router's --profile-file reads,
and refuses points it cannot measure in one line."""

from __future__ import annotations

import json
import math

import pytest

from inferfleet_operator.router.config import parse_profiles
from inferfleet_runtime.cli import main

SMALL_POINTS = ("--prompt-lengths", "8,32", "--batch-sizes", "1,4", "--decode-steps", "4", "--repeats", "3")
ONE_POINT = ("--prompt-lengths", "8", "--batch-sizes", "1", "--decode-steps", "1", "--repeats", "1")
ERROR_PREFIX = "inferfleet-runtime profile: error: "


def test_profile_of_the_demo_model_is_read_by_the_router_and_matches_the_engine(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "profiles.json"
    engine_flags = ("--block-size", "8", "--num-kv-blocks", "300", "--max-num-seqs", "6")
    argv = ["profile", "--model", str(demo_model_dir), "--pool", "cpu-demo", "--out", str(out)]
    assert main([*argv, *engine_flags, *SMALL_POINTS]) == 0

    [(pool, profile)] = parse_profiles(out.read_text(), str(out)).items()
    assert pool == "cpu-demo"
    assert [x for x, _ in profile.prefill] == [8, 32]
    assert [x for x, _ in profile.decode] == [1, 4]
    rates = [y for _, y in profile.prefill + profile.decode]
    assert all(math.isfinite(rate) and rate > 0 for rate in rates), rates
    assert (profile.block_size, profile.kv_capacity_tokens, profile.max_batch) == (8, 300 * 8, 6)
    assert profile.has_prefix_cache is True
    captured = capsys.readouterr()
    assert captured.out == ""  # the profile went to --out; progress goes to stderr
    assert "Measured prefill of 32 tokens" in captured.err and "Measured decode at batch 4" in captured.err


def test_profile_without_out_writes_the_default_pool_to_stdout(demo_model_dir, capsys):
    argv = ["profile", "--model", str(demo_model_dir), "--num-kv-blocks", "64", "--no-prefix-caching", *ONE_POINT]
    assert main(argv) == 0
    [(pool, profile)] = parse_profiles(capsys.readouterr().out, "stdout").items()
    assert pool == "default"  # the router's pool of endpoints named without one
    assert profile.has_prefix_cache is False
    assert (profile.block_size, profile.kv_capacity_tokens) == (16, 64 * 16)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--batch-sizes", "1,0"), "--batch-sizes: '0' is not a positive integer"),
        (("--prompt-lengths", "16,x"), "--prompt-lengths: 'x' is not a positive integer"),
        (("--repeats", "0"), "--repeats must be at least 1"),
        (("--batch-sizes", "8", "--max-num-seqs", "4"), "a batch of 8 exceeds the engine's 4 sequences"),
        (("--prompt-lengths", "1024"), "a prompt of 1024 tokens leaves no room for an output token"),
        (("--batch-sizes", "4", "--num-kv-blocks", "8"), "4 sequences of 36 tokens need 12 KV blocks"),
    ],
)
def test_profile_refuses_points_it_cannot_measure_in_one_line(demo_model_dir, capsys, flags, message):
    assert main(["profile", "--model", str(demo_model_dir), *ONE_POINT, *flags]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith(ERROR_PREFIX) and message in line, line
    assert captured.out == ""


def test_profile_refuses_a_missing_model_directory(tmp_path, capsys):
    assert main(["profile", "--model", str(tmp_path / "missing"), *ONE_POINT]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(ERROR_PREFIX) and "is not a model directory" in line


def _engine(demo_model_dir, *flags: str):
    import argparse

    from inferfleet_runtime.engine.llm_engine import LLMEngine
    from inferfleet_runtime.server.cli import add_engine_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return LLMEngine.from_model_dir(str(demo_model_dir), config_from_args(parser.parse_args(list(flags))))


def test_calibration_skips_what_does_not_fit_and_says_so(demo_model_dir, capsys):
    from inferfleet_runtime.engine.calibration import calibrate_engine

    engine = _engine(demo_model_dir, "--num-kv-blocks", "64", "--max-context-length", "16")
    assert calibrate_engine(engine) is None  # no calibration prompt leaves room for an output token
    assert "Not calibrated: no calibration point fits" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_calibrate_serves_the_profile_the_router_reads_and_only_then_is_ready(demo_model_dir):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from ..support.server_harness import serve_process

    flags = ("--model", str(demo_model_dir), "--num-kv-blocks", "128", "--max-num-seqs", "4", "--log-level", "warning")
    with serve_process(*flags, "--calibrate") as pod:
        answer = httpx.get(f"{pod.base_url}/profile")
        assert answer.status_code == 200
        [(_, profile)] = parse_profiles(json.dumps({"cpu": answer.json()}), "/profile").items()
        assert [x for x, _ in profile.prefill] == [16, 128] and [x for x, _ in profile.decode] == [1, 4]
        assert profile.max_batch == 4 and profile.kv_capacity_tokens == 128 * 16
        # The measurement ran no request through the server: its output-token counter starts at zero.
        families = text_string_to_metric_families(httpx.get(f"{pod.base_url}/metrics").text)
        generated = [x.value for f in families for x in f.samples if x.name == "inferfleet:generation_tokens_total"]
        assert sum(generated) == 0
    with serve_process(*flags, "--api-key", "k", "--protect-metrics") as pod:
        assert httpx.get(f"{pod.base_url}/profile").status_code == 401
        answer = httpx.get(f"{pod.base_url}/profile", headers={"Authorization": "Bearer k"})
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "no_profile"


def test_rates_are_sustained_over_pauses_as_a_cpu_quota_makes_them(demo_model_dir, monkeypatch):
    """A container limited to part of a core runs at full speed between pauses of its quota period: a rate from a
    few milliseconds of steps would miss them. Pauses (here 30 ms every 4th step) count in the measured rate."""
    import random
    import time

    from inferfleet_runtime.engine import calibration

    engine = _engine(demo_model_dir, "--num-kv-blocks", "256", "--max-context-length", "128")
    step, calls = engine.step, []

    def paused_step():
        calls.append(1)
        if len(calls) % 4 == 0:
            time.sleep(0.03)
        return step()

    monkeypatch.setattr(engine, "step", paused_step)
    batch = 2
    rate = calibration.decode_rate(engine, batch, 8, 2, random.Random(0))
    # At most `batch` tokens a step and a 30 ms pause every 4 steps: no more than batch * 4 / 0.03 tokens a second
    # (the pauses between timed windows are not counted, so the bound leaves room for them).
    assert rate <= batch * 4 / 0.03
    # The point was measured for MIN_TIMED_SECONDS at least: every round's windows time 16 steps, 4 of them paused.
    assert len(calls) * 0.03 / 4 >= calibration.MIN_TIMED_SECONDS * 0.8
    # Prefill too: its runs add up to MIN_TIMED_SECONDS, pauses included.
    before = len(calls)
    calibration.prefill_rate(engine, 32, 2, random.Random(1))
    assert (len(calls) - before) * 0.03 / 4 >= calibration.MIN_TIMED_SECONDS * 0.8
