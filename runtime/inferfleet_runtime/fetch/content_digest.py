"""The content manifest of a model directory (every file's name, size and sha256, plus the hub commit a fetch
resolved) and its digest: what a compiled engine's directory is addressed by, so changed model bytes never reuse
an engine built from other bytes.

`fetch` from hf:// records the commit the revision resolved to in SOURCE_NAME inside the model directory; the
manifest carries it, so an hf:// engine is addressed by its commit as well as by its bytes (a branch that moves
gives a new digest even where no file changed). Hidden bookkeeping (snapshot_download's `.cache/`, `.part` files) is not
the model and is left out; the loader reads none of it (a hidden `*.safetensors` is not a weight file to it either,
and a shard the index names outside the directory is refused), so the digest covers every byte the loader reads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SOURCE_NAME = ".inferfleet-source.json"  # {"uri": ..., "revision": ..., "commit": ...}, written by fetch (hf://)
DIGEST_LENGTH = 16  # hex characters: the engine directory's name under its key


def write_source(model_dir: Path, uri: str, revision: str, commit: str) -> None:
    """Records where a fetched model came from: the revision asked for and the commit it resolved to."""
    text = json.dumps({"commit": commit, "revision": revision, "uri": uri}, sort_keys=True) + "\n"
    (model_dir / SOURCE_NAME).write_text(text)


def read_commit(model_dir: Path) -> str:
    """The hub commit the model was fetched at, "" when it was not fetched from a hub (or the record is unreadable)."""
    try:
        value = json.loads((model_dir / SOURCE_NAME).read_text()).get("commit", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def is_left_out(relative: Path) -> bool:
    """Whether the manifest leaves out a path relative to the model directory: hidden bookkeeping or a `.part`
    download. The loader reads no such file (checkpoints.loader.safetensors_files, gguf.find_gguf)."""
    return relative.name.endswith(".part") or any(part.startswith(".") for part in relative.parts)


def _is_model_file(path: Path, root: Path) -> bool:
    return path.is_file() and not is_left_out(path.relative_to(root))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_manifest(model_dir: Path) -> dict:
    """{"files": [{"name", "size", "sha256"}, ...] sorted by name, "commit": the hub commit or ""}.

    Reads every byte of the model once (sha256 over each file, streamed). A symlink that leaves the
    directory is refused (ValueError): its target is not the model the directory names."""
    root = model_dir.resolve()
    files = []
    for path in sorted(model_dir.rglob("*")):
        if not _is_model_file(path, model_dir):
            continue
        if not path.resolve().is_relative_to(root):
            raise ValueError(f"{path} is a symlink to {path.resolve()}, outside the model directory {model_dir}")
        rel = path.relative_to(model_dir).as_posix()
        files.append({"name": rel, "size": path.stat().st_size, "sha256": _sha256(path)})
    if not files:
        raise ValueError(f"{model_dir} holds no model files")
    return {"commit": read_commit(model_dir), "files": files}


def content_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON, first DIGEST_LENGTH hex digits."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_LENGTH]
