"""`inferfleet-runtime compile`: progress lines, the engine directory it writes, and its exit codes.

The build orchestration is checked here with a stand-in backend that writes small files (the real
AOTInductor build is exercised once per session by the compiled_demo_engine fixture)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from inferfleet_runtime.cli import main
from inferfleet_runtime.compiled import export
from inferfleet_runtime.compiled.backends import BackendUnavailable
from inferfleet_runtime.compiled.manifest import device_architecture

from ..support.compile_backends import stand_in_backend

PROGRESS = re.compile(r"^progress stage=(\S+) percent=(\d+)$")
TINY = ["--max-context-length", "64", "--max-batch-size", "4", "--dtype", "float32", "--device", "cpu"]


@pytest.fixture
def stand_in(monkeypatch):
    def install(fail_at=None):
        backend = stand_in_backend(fail_at)
        monkeypatch.setattr(export, "get_backend", lambda name: backend)
        return backend

    return install


def test_build_reports_progress_and_writes_a_manifest(demo_model_dir, tmp_path, stand_in, capsys, monkeypatch):
    backend = stand_in()
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(termination_log))
    out = tmp_path / "engine"
    code = main(
        [
            "compile",
            "--model",
            str(demo_model_dir),
            "--out",
            str(out),
            "--backend",
            "aotinductor",
            *TINY,
            "--decode-buckets",
            "2,4",
            "--prefill-buckets",
            "8,16",
            "--engine-key",
            "k1",
            "--target-architecture",
            "amd64",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    progress = [PROGRESS.match(line).groups() for line in lines if line.startswith("progress ")]
    percents = [int(p) for _, p in progress]
    assert percents == sorted(percents) and percents[-1] == 100
    assert [s for s, _ in progress] == [
        "load",
        "export-decode-b2",
        "export-decode-b4",
        "export-prefill-l8",
        "export-prefill-l16",
        "write",
        "done",
    ]
    assert lines[-1].startswith(f"built engine=k1 dir={out} seconds=")
    # decode graphs take one token per row, prefill graphs one row of bucket length
    assert backend.built == [
        ("decode-b2.pt2", (2, 1)),
        ("decode-b4.pt2", (4, 1)),
        ("prefill-l8.pt2", (1, 8)),
        ("prefill-l16.pt2", (1, 16)),
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine_key"] == "k1" and manifest["backend"] == "aotinductor"
    assert manifest["target_architecture"] == device_architecture(torch.device("cpu"))
    assert manifest["envelope"]["max_context_length"] == 64 and manifest["envelope"]["decode_buckets"] == [2, 4]
    assert set(manifest["versions"]) == {"torch", "inferfleet"}
    assert manifest["sizes"]["graph_bytes"] == 4 * 50
    assert manifest["sizes"]["kv_cache_bytes"] == 3 * 2 * 4 * 64 * 2 * 24 * 4  # layers, K/V, slots, ctx, heads, dim
    assert (out / "model" / "tokenizer.json").is_file() and not list((out / "model").glob("*.safetensors"))
    assert not list(tmp_path.glob(".engine.building-*"))
    # what the operator reads from the compile container's termination message
    result = json.loads(termination_log.read_text())
    assert result["artifactSizeBytes"] == manifest["sizes"]["total_bytes"] > manifest["sizes"]["graph_bytes"]
    assert result["engineKey"] == "k1" and result["artifactPath"] == str(out)


def test_the_engine_digest_is_reported_on_the_last_line_and_in_the_termination_message(
    demo_model_dir, tmp_path, stand_in, capsys, monkeypatch
):
    from inferfleet_runtime.compiled.manifest import DIGEST_PATTERN, engine_digest, read_manifest

    stand_in()
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(log))
    out = tmp_path / "e"
    assert main(["compile", "--model", str(demo_model_dir), "--out", str(out), *TINY, *_K2]) == 0
    digest = engine_digest(read_manifest(out))
    assert DIGEST_PATTERN.match(digest) and json.loads(log.read_text())["engineDigest"] == digest
    assert capsys.readouterr().out.splitlines()[-1].endswith(f" digest={digest}")


_K2 = ["--engine-key", "k2", "--decode-buckets", "4", "--prefill-buckets", "16", "--backend", "aotinductor"]


def _plant(out):
    """Replaces the engine at out by another one whose manifest's checksums match its files (a writer of the cache)."""
    from inferfleet_runtime.compiled.manifest import file_checksums, read_manifest, write_manifest

    (out / "graphs" / "decode-b4.pt2").write_bytes(b"planted native code")
    manifest = read_manifest(out)
    manifest.checksums = file_checksums(out)
    write_manifest(out, manifest)


def test_an_engine_found_at_out_is_rebuilt_unless_it_has_the_digest_the_operator_recorded(
    demo_model_dir, tmp_path, stand_in
):
    from inferfleet_runtime.compiled.manifest import engine_digest, read_manifest, verify_checksums

    backend = stand_in()
    out = tmp_path / "e"
    args = ["compile", "--model", str(demo_model_dir), "--out", str(out), *TINY, *_K2]
    assert main(args) == 0 and len(backend.built) == 2
    built = engine_digest(read_manifest(out))
    assert main(args + ["--engine-digest", built]) == 0 and len(backend.built) == 2  # the recorded engine: kept
    assert main(args) == 0 and len(backend.built) == 4  # no digest to check it against: not trusted, rebuilt
    rebuilt = engine_digest(read_manifest(out))
    _plant(out)
    verify_checksums(out, read_manifest(out))  # the planted engine passes the folder's own checks
    assert main(args + ["--engine-digest", rebuilt]) == 0 and len(backend.built) == 6  # but not the digest
    assert (out / "graphs" / "decode-b4.pt2").read_bytes() != b"planted native code"


def test_keep_existing_keeps_an_intact_engine_of_the_key_whatever_its_digest(demo_model_dir, tmp_path, stand_in):
    backend = stand_in()
    out = tmp_path / "e"
    args = ["compile", "--model", str(demo_model_dir), "--out", str(out), *TINY, *_K2, "--keep-existing"]
    assert main(args) == 0 and len(backend.built) == 2
    assert main(args) == 0 and len(backend.built) == 2  # a cache shared by the administrator's choice
    (out / "graphs" / "decode-b4.pt2").write_bytes(b"damaged")
    assert main(args) == 0 and len(backend.built) == 4  # ... but never a damaged one


def test_a_malformed_engine_digest_exits_2(demo_model_dir, tmp_path, capsys):
    args = ["compile", "--model", str(demo_model_dir), "--out", str(tmp_path / "e"), *TINY, *_K2]
    with pytest.raises(SystemExit) as info:
        main(args + ["--engine-digest", "../../etc"])
    assert info.value.code == 2 and "--engine-digest: expected sha256:" in capsys.readouterr().err


def test_failed_build_exits_1_and_leaves_no_engine(demo_model_dir, tmp_path, stand_in, capsys, monkeypatch):
    stand_in(fail_at="prefill")
    termination_log = tmp_path.parent / f"{tmp_path.name}-termination-log"
    termination_log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(termination_log))
    out = tmp_path / "engine"
    code = main(
        [
            "compile",
            "--model",
            str(demo_model_dir),
            "--out",
            str(out),
            "--backend",
            "aotinductor",
            *TINY,
            "--decode-buckets",
            "4",
            "--prefill-buckets",
            "16",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1] == "inferfleet-runtime compile: error: build failed: RuntimeError: compiler crashed"
    assert not out.exists() and not list(tmp_path.iterdir())
    assert termination_log.read_text() == err[-1]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prefill-buckets", "16,128"], "must lie in [2, --max-context-length 64]"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2 is not supported"),
        (["--target-architecture", "sm90"], "the build targets sm90, but this machine's cpu is cpu-"),
    ],
)
def test_bad_input_exits_2_with_one_line(demo_model_dir, tmp_path, stand_in, capsys, extra, message):
    backend = stand_in()
    code = main(
        [
            "compile",
            "--model",
            str(demo_model_dir),
            "--out",
            str(tmp_path / "e"),
            "--backend",
            "aotinductor",
            *TINY,
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert backend.built == [] and not (tmp_path / "e").exists()


def test_context_beyond_the_model_exits_2(demo_model_dir, tmp_path, capsys):
    code = main(
        [
            "compile",
            "--model",
            str(demo_model_dir),
            "--out",
            str(tmp_path / "e"),
            "--device",
            "cpu",
            "--max-context-length",
            "100000",
        ]
    )
    assert code == 2 and "exceeds the model's max_position_embeddings 1024" in capsys.readouterr().err


def test_missing_model_dir_exits_2(tmp_path, capsys):
    assert main(["compile", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "e")]) == 2
    assert "is not a model directory" in capsys.readouterr().err


def test_unavailable_backend_exits_2(demo_model_dir, tmp_path, monkeypatch, capsys):
    from inferfleet_runtime.compiled.backends import aotinductor

    def unavailable(device):
        raise BackendUnavailable("the aotinductor backend needs a C++ compiler (g++) on the CPU; install g++")

    monkeypatch.setattr(aotinductor, "check_available", unavailable)
    code = main(
        ["compile", "--model", str(demo_model_dir), "--out", str(tmp_path / "e"), "--backend", "aotinductor", *TINY]
    )
    assert code == 2 and "needs a C++ compiler" in capsys.readouterr().err


def test_content_addressed_build_lands_under_the_model_digest_and_reports_it(
    demo_model_dir, tmp_path, stand_in, monkeypatch
):
    from inferfleet_runtime.fetch.content_digest import content_digest, content_manifest

    stand_in()
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(log))
    out = tmp_path / "engines" / "k3"
    args = ["compile", "--model", str(demo_model_dir), "--out", str(out), *TINY, "--engine-key", "k3"]
    args += ["--decode-buckets", "4", "--prefill-buckets", "16", "--backend", "aotinductor", "--content-addressed"]
    assert main(args) == 0
    digest = content_digest(content_manifest(demo_model_dir))
    manifest = json.loads((out / digest / "manifest.json").read_text())
    assert manifest["model_digest"] == digest and manifest["model_commit"] == ""
    result = json.loads(log.read_text())
    assert result["modelDigest"] == digest and result["artifactPath"] == str(out / digest)
    assert sorted(p.name for p in out.iterdir()) == [digest]  # nothing at the key's own level


def test_content_addressed_build_refuses_a_model_with_a_symlink_out(demo_model_dir, tmp_path, stand_in, capsys):
    stand_in()
    model = tmp_path / "model"
    shutil.copytree(demo_model_dir, model)
    (tmp_path / "elsewhere").write_text("x")
    (model / "extra.json").symlink_to(tmp_path / "elsewhere")
    out = tmp_path / "e"
    args = ["compile", "--model", str(model), "--out", str(out), *TINY, "--content-addressed"]
    assert main(args) == 2
    assert "outside the model directory" in capsys.readouterr().err and not out.exists()


def test_rebuild_over_a_damaged_engine_of_the_same_key_replaces_it(demo_model_dir, tmp_path, stand_in):
    from inferfleet_runtime.compiled.manifest import read_manifest, verify_checksums

    backend = stand_in()
    out = tmp_path / "e"
    args = ["compile", "--model", str(demo_model_dir), "--out", str(out), *TINY, "--engine-key", "k4"]
    args += ["--decode-buckets", "4", "--prefill-buckets", "16", "--backend", "aotinductor"]
    assert main(args) == 0 and len(backend.built) == 2
    (out / "graphs" / "decode-b4.pt2").write_bytes(b"damaged")
    assert main(args) == 0 and len(backend.built) == 4  # built again, not kept
    verify_checksums(out, read_manifest(out))
