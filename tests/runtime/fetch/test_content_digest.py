"""model_content: the content manifest and digest a compiled engine's directory is addressed by."""

from __future__ import annotations

import os
import shutil

import pytest

from inferfleet_runtime.fetch.content_digest import (
    SOURCE_NAME,
    content_digest,
    content_manifest,
    read_commit,
    write_source,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def model(tmp_path):
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "weights.bin").write_bytes(b"\x00" * 64)
    (root / "sub" / "extra.txt").write_text("x")
    return root


def digest(path) -> str:
    return content_digest(content_manifest(path))


def test_manifest_lists_every_file_with_its_size_and_sha256(model):
    manifest = content_manifest(model)
    assert [f["name"] for f in manifest["files"]] == ["config.json", "sub/extra.txt", "weights.bin"]
    assert [f["size"] for f in manifest["files"]] == [8, 1, 64]
    assert all(len(f["sha256"]) == 64 for f in manifest["files"]) and manifest["commit"] == ""


def test_a_byte_changed_in_place_at_the_same_size_changes_the_digest(model):
    before = digest(model)
    (model / "weights.bin").write_bytes(b"\x00" * 63 + b"\x01")
    assert digest(model) != before


def test_renamed_added_or_removed_files_change_the_digest(model, tmp_path):
    seen = {digest(model)}
    (model / "sub" / "extra.txt").rename(model / "sub" / "other.txt")
    seen.add(digest(model))
    (model / "more.json").write_text("{}")
    seen.add(digest(model))
    (model / "more.json").unlink()
    (model / "sub" / "other.txt").unlink()
    seen.add(digest(model))
    assert len(seen) == 4


def test_the_same_bytes_elsewhere_give_the_same_digest(model, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    os.utime(copy / "weights.bin", (0, 0))  # times are not content
    assert digest(copy) == digest(model)


def test_bookkeeping_is_not_content_and_the_hub_commit_is(model):
    before = digest(model)
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "weights.bin.metadata").write_text("etag 123")
    (model / "weights.bin.part").write_bytes(b"half")
    assert digest(model) == before
    write_source(model, "hf://org/m", "main", COMMIT)
    assert read_commit(model) == COMMIT and content_manifest(model)["commit"] == COMMIT
    assert SOURCE_NAME not in [f["name"] for f in content_manifest(model)["files"]]
    assert digest(model) != before


def test_a_symlink_out_of_the_model_directory_is_refused(model, tmp_path):
    outside = tmp_path / "secret"
    outside.write_text("not the model")
    (model / "tokenizer.json").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the model directory"):
        content_manifest(model)


def test_an_empty_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no model files"):
        content_manifest(tmp_path)


def test_an_unreadable_source_record_reads_as_no_commit(model):
    (model / SOURCE_NAME).write_text("not json")
    assert read_commit(model) == ""
