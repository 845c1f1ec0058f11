"""Manifest round trip and the serve-time check against this machine and these versions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferfleet_runtime.compiled.envelope import Envelope
from inferfleet_runtime.compiled.manifest import (
    EngineLost,
    EngineMismatch,
    GraphEntry,
    Manifest,
    check_compatible,
    device_architecture,
    file_checksums,
    inferfleet_version,
    normalize_architecture,
    read_manifest,
    verify_checksums,
    write_manifest,
)

CPU = torch.device("cpu")


def _manifest(**overrides) -> Manifest:
    base = Manifest(
        engine_key="abc123",
        backend="aotinductor",
        target_architecture=device_architecture(CPU),
        envelope=Envelope(max_context_length=64, max_batch_size=4),
        versions={"torch": torch.__version__, "inferfleet": inferfleet_version()},
        model={"name": "m"},
        graphs=[GraphEntry("decode", 4, "graphs/decode-b4.pt2", 10)],
        build_seconds=1.5,
        sizes={"total_bytes": 10},
    )
    return dataclasses.replace(base, **overrides)


def test_manifest_round_trips_through_its_file(tmp_path):
    manifest = _manifest()
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest


def test_cpu_architecture_names_the_machine_and_maps_operator_names():
    arch = device_architecture(CPU)
    assert arch.startswith("cpu-")
    assert normalize_architecture("cpu") == arch
    assert normalize_architecture("amd64") == "cpu-x86_64"
    assert normalize_architecture("arm64") == "cpu-aarch64"
    assert normalize_architecture("SM90") == "sm90"


def test_accepts_an_engine_built_here():
    check_compatible(_manifest(), CPU)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(target_architecture="sm90"), "was built for sm90, this machine is cpu-"),
        (dict(versions={"torch": "2.0.0", "inferfleet": inferfleet_version()}), "built with torch 2.0.0"),
        (dict(versions={"torch": torch.__version__, "inferfleet": "0.0.1"}), "built with inferfleet 0.0.1"),
        (dict(format_version=99), "manifest format 99"),
    ],
)
def test_refuses_a_mismatched_engine_with_one_line(overrides, message):
    with pytest.raises(EngineMismatch) as info:
        check_compatible(_manifest(**overrides), CPU)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unreadable_manifest_is_a_mismatch(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(EngineMismatch, match="not a readable engine manifest"):
        read_manifest(tmp_path)
    with pytest.raises(EngineMismatch, match="no manifest.json"):
        read_manifest(tmp_path / "missing")


def _engine_dir(tmp_path):
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "decode-b4.pt2").write_bytes(b"graph bytes")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    manifest = _manifest(checksums=file_checksums(tmp_path))
    write_manifest(tmp_path, manifest)
    return manifest


def test_checksums_cover_every_artifact_but_the_manifest(tmp_path):
    manifest = _engine_dir(tmp_path)
    assert sorted(manifest.checksums) == ["graphs/decode-b4.pt2", "model/tokenizer.json"]
    verify_checksums(tmp_path, read_manifest(tmp_path))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "graphs" / "decode-b4.pt2").write_bytes(b"graph byteZ"), "does not match its checksum"),
        (lambda d: (d / "graphs" / "decode-b4.pt2").write_bytes(b"graph"), "does not match its checksum"),
        (lambda d: (d / "model" / "tokenizer.json").unlink(), "lacks its artifact model/tokenizer.json"),
    ],
)
def test_a_changed_truncated_or_missing_artifact_is_refused(tmp_path, damage, message):
    manifest = _engine_dir(tmp_path)
    damage(tmp_path)
    with pytest.raises(EngineMismatch, match=message):
        verify_checksums(tmp_path, manifest)


def test_a_manifest_without_checksums_or_with_an_escaping_path_is_refused(tmp_path):
    _engine_dir(tmp_path)
    with pytest.raises(EngineMismatch, match="lists no artifact checksums"):
        verify_checksums(tmp_path, _manifest())
    with pytest.raises(EngineMismatch, match="outside the engine directory"):
        verify_checksums(tmp_path / "graphs", _manifest(checksums={"../model/tokenizer.json": "0" * 64}))


@pytest.mark.parametrize(
    "graph_file, message",
    [
        ("/etc/evil.pt2", "outside the engine directory"),
        ("../outside.pt2", "outside the engine directory"),
        ("graphs/../../outside.pt2", "outside the engine directory"),
        ("graphs/unlisted.pt2", "not covered by its checksums"),
    ],
)
def test_a_graph_outside_the_directory_or_its_checksums_is_refused(tmp_path, graph_file, message):
    engine = tmp_path / "engine"
    engine.mkdir()
    (tmp_path / "outside.pt2").write_bytes(b"native code")
    manifest = _engine_dir(engine)
    (engine / "graphs" / "unlisted.pt2").write_bytes(b"native code")
    manifest.graphs.append(GraphEntry("prefill", 16, graph_file, 11))
    manifest.checksums = {k: v for k, v in file_checksums(engine).items() if k != "graphs/unlisted.pt2"}
    with pytest.raises(EngineLost, match=message):
        verify_checksums(engine, manifest)


def test_a_file_in_the_directory_that_the_checksums_do_not_cover_is_refused(tmp_path):
    manifest = _engine_dir(tmp_path)
    (tmp_path / "model" / "tokenizer_config.json").write_text('{"chat_template": "planted"}')  # read at load
    with pytest.raises(EngineLost, match="model/tokenizer_config.json is not covered by its checksums"):
        verify_checksums(tmp_path, manifest)


def test_an_artifact_that_is_a_symlink_is_refused_even_with_the_right_checksum(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    manifest = _engine_dir(engine)
    outside = tmp_path / "outside.pt2"
    outside.write_bytes((engine / "graphs" / "decode-b4.pt2").read_bytes())
    (engine / "graphs" / "decode-b4.pt2").unlink()
    (engine / "graphs" / "decode-b4.pt2").symlink_to(outside)
    with pytest.raises(EngineLost, match="is a symlink"):
        verify_checksums(engine, manifest)


def test_the_engine_digest_covers_the_manifest_and_so_every_checksum(tmp_path):
    from inferfleet_runtime.compiled.manifest import DIGEST_PATTERN, engine_digest

    manifest = _engine_dir(tmp_path)
    digest = engine_digest(read_manifest(tmp_path))
    assert DIGEST_PATTERN.match(digest) and engine_digest(manifest) == digest
    # A planted engine: other graph bytes under a manifest whose checksums match them.
    (tmp_path / "graphs" / "decode-b4.pt2").write_bytes(b"planted native code")
    planted = dataclasses.replace(manifest, checksums=file_checksums(tmp_path))
    write_manifest(tmp_path, planted)
    verify_checksums(tmp_path, read_manifest(tmp_path))  # it passes every check a writable folder can offer ...
    assert engine_digest(read_manifest(tmp_path)) != digest  # ... but not the digest the operator holds
    for changed in (dict(graphs=[GraphEntry("decode", 2, "graphs/decode-b4.pt2", 10)]), dict(engine_key="other")):
        assert engine_digest(dataclasses.replace(manifest, **changed)) != digest


def test_reading_an_engine_with_another_digest_than_expected_is_refused_as_lost(tmp_path):
    from inferfleet_runtime.compiled.manifest import engine_digest

    manifest = _engine_dir(tmp_path)
    assert read_manifest(tmp_path, expected_digest=engine_digest(manifest)) == manifest
    with pytest.raises(EngineLost, match="digest sha256:0{64}") as info:
        read_manifest(tmp_path, expected_digest="sha256:" + "0" * 64)
    assert "\n" not in str(info.value)
