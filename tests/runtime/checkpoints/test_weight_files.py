"""The weight files the loader reads: only the model folder's own files (no shard named or linked out of it), and none
the content digest leaves out (hidden files, .part downloads), so an engine addressed by the digest was built from
every byte the loader reads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from inferfleet_runtime.checkpoints.gguf import find_gguf
from inferfleet_runtime.checkpoints.loader import CheckpointError, load_model
from inferfleet_runtime.fetch.content_digest import content_manifest

# A tensor the loader skips (a rotary cache some checkpoints carry): a file holding it loads either way.
HARMLESS = "model.layers.0.self_attn.rotary_emb.inv_freq"


@pytest.fixture
def sharded(tiny_llama_factory, tmp_path):
    """A copy of a sharded tiny checkpoint (its index names two or more shards)."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_llama_factory("files-sharded", num_key_value_heads=2, max_shard_size="60KB"), model_dir)
    return model_dir


def rename_in_index(model_dir, new_name: str) -> None:
    """Points the index's entries for its last shard at new_name."""
    path = model_dir / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"] = {k: new_name if v == last else v for k, v in index["weight_map"].items()}
    path.write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/../../x.safetensors"])
def test_an_index_naming_a_shard_outside_the_model_folder_is_refused(sharded, name):
    rename_in_index(sharded, name)
    with pytest.raises(CheckpointError, match=f"names shard '{name}', which is no file name in the model folder"):
        load_model(sharded, kernels="reference")


def test_a_shard_linked_out_of_the_model_folder_is_refused(sharded, tmp_path):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    last = sharded / sorted(set(index["weight_map"].values()))[-1]
    outside = tmp_path / "elsewhere.safetensors"
    last.rename(outside)
    last.symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"shard {last.name} links to {outside}, outside the model folder"):
        load_model(sharded, kernels="reference")


@pytest.mark.parametrize("name", [".hidden.safetensors", "model-00002.safetensors.part"])
def test_an_index_naming_a_file_the_digest_leaves_out_is_refused(sharded, name):
    rename_in_index(sharded, name)
    with pytest.raises(CheckpointError, match=f"names shard '{name}', a hidden file or a partial download"):
        load_model(sharded, kernels="reference")


def test_every_weight_file_the_loader_reads_is_in_the_content_digest(tiny_llama_factory, tmp_path, monkeypatch):
    """A hidden .safetensors file beside the weights (here one the load would not mind) is not read: the digest,
    which leaves hidden files out, covers every file read."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_llama_factory("files-single", num_key_value_heads=2), model_dir)
    save_file({HARMLESS: torch.zeros(4)}, model_dir / ".stray.safetensors")
    from inferfleet_runtime.checkpoints import loader

    opened = []

    def spying_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    real_open = loader.safe_open
    monkeypatch.setattr(loader, "safe_open", spying_open)
    load_model(model_dir, kernels="reference")
    digested = {str(model_dir / f["name"]) for f in content_manifest(model_dir)["files"]}
    assert opened and set(opened) <= digested, set(opened) - digested


def test_a_hidden_gguf_file_is_not_the_model(tmp_path):
    (tmp_path / ".old.gguf").write_bytes(b"GGUF")
    assert find_gguf(tmp_path) is None
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert find_gguf(tmp_path) == tmp_path / "model.gguf"


def test_a_gguf_linked_out_of_the_model_folder_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.gguf").symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"model.gguf links to {outside}, outside the model folder"):
        find_gguf(tmp_path / "model")
