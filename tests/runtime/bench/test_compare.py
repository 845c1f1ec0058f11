"""`inferfleet-runtime bench compare` runs end to end (alone, and against a stand-in llama-server), and the GGUF
writer produces a file the `gguf` reader parses with llama.cpp's names, shapes and tokenizer."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from inferfleet_runtime.bench import compare
from inferfleet_runtime.bench.gguf_export import rope_rows_interleaved, write_gguf
from inferfleet_runtime.cli import main

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=384,
)


@pytest.fixture(scope="module")
def tiny_model(tiny_llama_factory):
    return tiny_llama_factory("compare-tiny", **TINY)


def test_gguf_has_llama_cpp_names_shapes_and_the_whole_vocab(tiny_model, tmp_path):
    gguf = pytest.importorskip("gguf")
    path = write_gguf(tiny_model, tmp_path / "model.gguf")
    reader = gguf.GGUFReader(str(path))
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    # ggml lists dimensions innermost first: a [rows, cols] matrix reads as (cols, rows).
    assert shapes["token_embd.weight"] == (64, 384) and shapes["output.weight"] == (64, 384)
    assert shapes["blk.1.attn_q.weight"] == (64, 64) and shapes["blk.1.attn_k.weight"] == (64, 32)
    assert shapes["blk.0.ffn_gate.weight"] == (64, 128) and shapes["blk.0.ffn_down.weight"] == (128, 64)
    assert shapes["output_norm.weight"] == (64,) and len(shapes) == 3 + 2 * 9
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)

    def field(name):
        return reader.fields[name].contents()

    assert field("general.architecture") == "llama"
    assert (
        field("llama.block_count"),
        field("llama.attention.head_count"),
        field("llama.attention.head_count_kv"),
    ) == (2, 4, 2)
    assert field("tokenizer.ggml.model") == "gpt2" and field("tokenizer.ggml.pre") == "default"
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == 384 and tokens[383] == "[PAD383]"  # the tokenizer has 300 ids, the model 384
    vocab = json.loads((tiny_model / "tokenizer.json").read_text())["model"]["vocab"]
    assert all(tokens[i] == t for t, i in vocab.items())


def test_rope_rows_move_from_half_split_pairs_to_adjacent_pairs():
    head_dim, num_heads = 8, 2
    rows = np.arange(num_heads * head_dim, dtype=np.float32)[:, None]  # each row holds its HF index
    out = rope_rows_interleaved(rows, num_heads)[:, 0]
    # head 0: HF pairs (0, 4), (1, 5), ... become rows (0, 1), (2, 3), ...; head 1 the same, offset by 8.
    assert out.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def _run_compare(tiny_model, tmp_path, *extra):
    out, png = tmp_path / "compare.json", tmp_path / "compare.png"
    code = main(
        [
            "bench",
            "compare",
            "--model",
            str(tiny_model),
            "--concurrency",
            "1,2",
            "--num-prompts",
            "3",
            "--input-len",
            "4:8",
            "--output-len",
            "3",
            "--rounds",
            "1",
            "--result-json",
            str(out),
            "--plot",
            str(png),
            *extra,
        ]
    )
    return code, json.loads(out.read_text()) if out.exists() else None, png


@pytest.mark.slow
def test_without_llama_server_it_benchmarks_this_runtime_alone_and_says_so(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server anywhere on PATH
    monkeypatch.setenv("GOMP_SPINCOUNT", "3000")  # an OpenMP setting the server inherits: stated with its command
    code, result, png = _run_compare(tiny_model, tmp_path)
    assert code == 0
    printed = capsys.readouterr().out
    assert "benchmarking inferfleet alone" in printed and "llama-server: not run" in printed
    command = "GOMP_SPINCOUNT=3000 OMP_WAIT_POLICY=PASSIVE " + sys.executable + " -m inferfleet_runtime.cli serve"
    assert f"inferfleet: {command}" in printed and result["config"]["servers"]["inferfleet"].startswith(command)
    assert result["config"]["llama_server_found"] is False and list(result["rounds"]) == ["inferfleet"]
    for level in ("1", "2"):
        entry = result["summary"]["levels"][level]
        assert "llama-server" not in entry and "ratio_best" not in entry
        assert entry["inferfleet"]["best_tok_s"] > 0
    # ignore_eos: every request produced exactly its 3 tokens at every level
    assert [lvl["output_tokens"] for lvl in result["rounds"]["inferfleet"][0]] == [9, 9]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_llama_server_none_benchmarks_this_runtime_alone_even_with_one_on_path(
    tiny_model, tmp_path, monkeypatch, capsys
):
    trap = tmp_path / "llama-server"
    trap.write_text("#!/bin/sh\nexit 3\n")  # started, it would fail the run
    trap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    code, result, _ = _run_compare(tiny_model, tmp_path, "--llama-server", "none")
    assert code == 0
    assert "llama-server: --llama-server none: benchmarking inferfleet alone" in capsys.readouterr().out
    assert list(result["rounds"]) == ["inferfleet"]


@pytest.mark.slow
def test_against_a_server_given_as_llama_server_it_prints_ratios(tiny_model, tmp_path, capsys):
    # A stand-in that accepts llama-server's flags and serves the checkpoint beside the GGUF with this runtime.
    fake = tmp_path / "llama-server"
    fake.write_text(f"""#!{sys.executable}
import argparse, os, sys
p = argparse.ArgumentParser()
for flag in ("-m", "--host", "--port", "-np", "-t", "-c"):
    p.add_argument(flag)
p.add_argument("-cb", action="store_true")
a = p.parse_args()
assert os.path.getsize(a.m) > 0 and a.np == "32" and a.t == "2", sys.argv
os.execv(sys.executable, [sys.executable, "-m", "inferfleet_runtime.cli", "serve", "--model", os.path.dirname(a.m),
                          "--host", a.host, "--port", a.port, "--log-level", "warning"])
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    gguf_path = tmp_path / "model" / "model-f32.gguf"
    model_copy = gguf_path.parent
    model_copy.mkdir()
    for f in tiny_model.iterdir():
        (model_copy / f.name).write_bytes(f.read_bytes())
    code, result, _ = _run_compare(model_copy, tmp_path, "--llama-server", str(fake))
    assert code == 0, capsys.readouterr()
    assert gguf_path.stat().st_size > 0  # written beside the checkpoint on first use
    printed = capsys.readouterr().out
    assert "ratio best/med" in printed and " -np 32 -cb -t 2 " in printed
    for level in ("1", "2"):
        entry = result["summary"]["levels"][level]
        ours, theirs = entry["inferfleet"], entry["llama-server"]
        assert entry["ratio_best"] == pytest.approx(ours["best_tok_s"] / theirs["best_tok_s"])
    assert [lvl["output_tokens"] for lvl in result["rounds"]["llama-server"][0]] == [9, 9]


def test_llama_server_runs_under_the_users_openmp_settings_not_this_packages_default(monkeypatch):
    args = argparse.Namespace(input_len="32:128", output_len=64, parallel=32, threads=2, llama_server_args="")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "3000")
    monkeypatch.setattr(compare, "OMP_WAIT_POLICY_IS_DEFAULT", True)  # set by importing the package
    spec = compare.llama_spec("/opt/llama-server", Path("m.gguf"), args)
    assert "OMP_WAIT_POLICY" not in compare.server_env(spec) and compare.server_env(spec)["GOMP_SPINCOUNT"] == "3000"
    assert compare.command_line(spec).startswith("GOMP_SPINCOUNT=3000 /opt/llama-server -m m.gguf ")
    monkeypatch.setattr(compare, "OMP_WAIT_POLICY_IS_DEFAULT", False)  # the user's own: both servers get it
    spec = compare.llama_spec("/opt/llama-server", Path("m.gguf"), args)
    assert compare.command_line(spec).startswith("GOMP_SPINCOUNT=3000 OMP_WAIT_POLICY=PASSIVE /opt/llama-server ")


def test_a_missing_llama_server_binary_is_refused_with_one_line(tiny_model, tmp_path, capsys):
    code = main(["bench", "compare", "--model", str(tiny_model), "--llama-server", str(tmp_path / "nope")])
    assert code == 2
    assert "is not an executable file" in capsys.readouterr().err


@pytest.mark.parametrize("method,qtype", [("int8", "Q8_0"), ("int4", "Q4_0")])
def test_quantized_comparison_serves_both_at_the_matching_quantization(
    tiny_model, tmp_path, monkeypatch, method, qtype
):
    import gguf

    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    model_copy = tmp_path / "model"
    model_copy.mkdir()
    for f in tiny_model.iterdir():
        (model_copy / f.name).write_bytes(f.read_bytes())
    started = []

    def record(spec, *_):  # the servers' commands, neither started
        started.append(spec)
        if spec.name == compare.LLAMA:
            raise RuntimeError("not started in this test")
        return []

    monkeypatch.setattr(compare, "measure", record)
    args = ["bench", "compare", "--model", str(model_copy), "--llama-server", str(fake), "--quantization", method]
    assert main(args) == 1
    ours, llama = started[0].argv, started[1].argv
    assert ours[ours.index("--quantization") + 1] == method
    path = Path(llama[llama.index("-m") + 1])
    assert path.name == f"model-{qtype.lower()}.gguf"
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_down.weight"] == types["token_embd.weight"] == qtype
    assert types["blk.0.attn_norm.weight"] == "F32"


def test_gguf_writer_refuses_an_unknown_matrix_type(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="F32, Q8_0, Q4_0, Q4_1"):
        write_gguf(tiny_model, tmp_path / "x.gguf", "Q5_K")
    assert not (tmp_path / "x.gguf").exists()
