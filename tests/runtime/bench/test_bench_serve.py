"""`inferfleet-runtime bench serve` against a real server of the built-in model on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from inferfleet_runtime.cli import main
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(device="cpu", max_num_seqs=8, num_kv_blocks=64)
    with running_server(lambda: ModelRunner.from_model_dir(demo_model_dir, config), config, MODEL) as srv:
        yield srv


@pytest.mark.slow
def test_a_small_run_reports_consistent_metrics_json_and_plot(server, demo_model_dir, tmp_path, capsys):
    out, png = tmp_path / "result.json", tmp_path / "plot.png"
    code = main(
        [
            "bench",
            "serve",
            "--url",
            server.base_url,
            "--num-prompts",
            "8",
            "--random-input-len",
            "4:16",
            "--random-output-len",
            "2:8",
            "--request-rate",
            "40",
            "--burstiness",
            "0.5",
            "--max-concurrency",
            "4",
            "--tokenizer",
            str(demo_model_dir),
            "--goodput",
            "ttft:2000",
            "tpot:500",
            "--seed",
            "1",
            "--result-json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "Successful requests:" in captured.out and "Median TPOT (ms):" in captured.out
    assert "8/8" in captured.err  # the progress bar reached every request

    result = json.loads(out.read_text())
    assert result["config"]["model"] == MODEL and result["config"]["burstiness"] == 0.5
    assert (result["num_requests"], result["completed"], result["failed"]) == (8, 8, 0)
    req = result["requests"]
    assert len(req["output_len"]) == 8 and all(req["success"])
    # ignore_eos: every request generated exactly its max_tokens, as the server's usage reports them
    assert req["output_len"] == req["expected_output_len"]
    assert result["total_output_tokens"] == sum(req["output_len"])
    assert result["total_input_tokens"] == sum(req["prompt_len"])
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration_s"])

    tpots = [
        (lat - ttft) / (n - 1) * 1000 for lat, ttft, n in zip(req["latency"], req["ttft"], req["output_len"]) if n > 1
    ]
    assert result["tpot_ms"]["mean"] == pytest.approx(sum(tpots) / len(tpots))
    for ttft, latency, itl in zip(req["ttft"], req["latency"], req["itl"]):
        assert 0 < ttft <= latency and sum(itl) <= latency - ttft + 1e-6
    assert result["ttft_ms"]["median"] <= result["ttft_ms"]["p90"] <= result["ttft_ms"]["p99"]
    assert result["e2el_ms"]["mean"] >= result["ttft_ms"]["mean"]

    good = sum(
        ttft * 1000 <= 2000 and (n < 2 or (lat - ttft) / (n - 1) * 1000 <= 500)
        for ttft, lat, n in zip(req["ttft"], req["latency"], req["output_len"])
    )
    assert 0 <= result["goodput_fraction"] <= 1
    assert result["num_good_requests"] == good and result["goodput_fraction"] == pytest.approx(good / 8)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_bench_refuses_bad_options_with_one_line(capsys):
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--goodput", "speed:3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--goodput" in err[0]
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--dataset", "sharegpt", "--no-progress"]) == 2
    assert "--dataset-path" in capsys.readouterr().err


def test_bench_reports_an_unreachable_server_in_one_line(capsys):
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--num-prompts", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot list models" in err[0]


def test_bench_sends_its_api_key_to_a_server_that_requires_one(demo_model_dir, capsys, monkeypatch):
    from inferfleet_runtime.server.auth import ApiKeys

    monkeypatch.delenv("INFERFLEET_API_KEY", raising=False)
    config = EngineConfig(device="cpu", max_num_seqs=4, num_kv_blocks=32)
    keys = ApiKeys.from_sources(["bench-key-1"])
    make_runner = lambda: ModelRunner.from_model_dir(demo_model_dir, config)  # noqa: E731
    with running_server(make_runner, config, MODEL, api_keys=keys) as srv:
        run = ["bench", "serve", "--url", srv.base_url, "--num-prompts", "3", "--random-input-len", "4",
               "--random-output-len", "2", "--no-progress"]  # fmt: skip
        assert main(run) == 1  # no key: the model list is refused
        assert "401" in capsys.readouterr().err
        assert main([*run, "--api-key", "bench-key-1"]) == 0
        assert "Successful requests:" in capsys.readouterr().out
        monkeypatch.setenv("INFERFLEET_API_KEY", "bench-key-1")  # the environment, as the server reads it
        assert main(run) == 0
