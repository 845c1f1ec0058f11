"""The offline comparison program on a tiny config: one concurrency level, a few tokens, the compiled engine left
out (compiling costs minutes here; the compiled engine's own tests and benchmark cover it)."""

from __future__ import annotations

import json

import pytest

from inferfleet_runtime.bench import offline


@pytest.mark.slow
def test_offline_comparison_prints_throughput_ratios_kv_waste_and_step_split(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "figures.json"
    code = offline.main(
        [
            "--model",
            str(demo_model_dir),
            "--concurrency",
            "3",
            "--input-len",
            "4:10",
            "--output-len",
            "2:6",
            "--skip-compiled",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "compiled engine: skipped (--skip-compiled)" in printed
    assert "paged/seq" in printed and "contiguous max-length reservation" in printed
    assert "schedule+postprocess" in printed and "model forward" in printed

    figures = json.loads(out.read_text())
    assert figures["compiled_skipped"] == "--skip-compiled"
    [level] = figures["levels"].values()
    assert level["requests"] == 3 and 3 * 2 <= level["output_tokens"] <= 3 * 6
    for key in ("hf_sequential_tok_s", "hf_padded_batch_tok_s", "paged_tok_s"):
        assert level[key] > 0
    assert level["compiled_tok_s"] is None
    # the padded batch computes every row to the longest request: at least the requested tokens
    assert level["hf_padded_batch_computed_tokens"] >= level["output_tokens"]
    assert 0 <= level["paged_matches_hf_greedy"] <= 1

    kv = figures["kv_memory"]
    assert kv["paged_peak_stored_tokens"] <= kv["paged_peak_slot_tokens"] < kv["contiguous_reserved_tokens"]
    assert kv["paged_peak_slot_tokens"] == kv["paged_peak_blocks"] * kv["block_size"]
    assert 0 <= kv["paged_waste_pct"] < kv["contiguous_waste_pct"] < 100

    split = figures["step_split"]
    assert split["num_seqs"] == 3 and split["steps"] >= 1
    assert split["schedule_postprocess_pct"] + split["runner_prep_sampling_pct"] + split[
        "forward_pct"
    ] == pytest.approx(100.0)
    assert split["forward_pct"] > 0
