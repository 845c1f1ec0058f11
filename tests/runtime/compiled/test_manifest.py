"""Manifest round trip and the serve-time check against this machine and these versions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inferfleet_runtime.compiled.envelope import Envelope
from inferfleet_runtime.compiled.manifest import (
    EngineMismatch,
    GraphEntry,
    Manifest,
    check_compatible,
    device_architecture,
    inferfleet_version,
    normalize_architecture,
    read_manifest,
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
