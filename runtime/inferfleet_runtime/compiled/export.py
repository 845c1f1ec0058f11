"""build_engine: loads a checkpoint, exports one graph per bucket over static KV buffers, writes the engine directory.

Layout of an engine directory:
    manifest.json          what was built (see manifest.py)
    model/                 the checkpoint's config and tokenizer files (no weights: those live in the graphs)
    graphs/decode-b{N}     one graph per decode bucket (batch size N, one new token each)
    graphs/prefill-l{N}    one graph per prefill bucket (one sequence, a chunk of up to N tokens)
The directory is written under a temporary name and renamed at the end, so a reader never sees half an engine.
An engine already at the output is kept only when someone vouches for it (the digest its EngineBuild recorded, or
an administrator who shares the cache): a folder anyone of the cache's writers could have filled is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from inferfleet_runtime.checkpoints.loader import load_model

from .backends import get_backend
from .envelope import Envelope
from .manifest import (
    EngineMismatch,
    GraphEntry,
    Manifest,
    device_architecture,
    file_checksums,
    library_versions,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from .step import StaticStep, example_inputs

Progress = Callable[[str, int], None]  # (stage, percent 0..100)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_RUNTIME = Path(__file__).parent.parent
_TRACED_SOURCES = [
    _RUNTIME / "compiled" / "step.py",
    *sorted((_RUNTIME / "models").glob("*.py")),
    *sorted((_RUNTIME / "layers").glob("*.py")),
    *(_RUNTIME / "kernels" / f"{name}.py" for name in ("rms_norm", "rotary", "activation", "paged_attention")),
]


def graph_name(kind: str, bucket: int) -> str:
    return f"decode-b{bucket}" if kind == "decode" else f"prefill-l{bucket}"


def default_engine_key(model_dir: Path, envelope: Envelope, backend: str, architecture: str) -> str:
    """A content hash over the checkpoint's config and weight sizes, the envelope, the target, the versions and
    the source the export traces (the step, the model and its reference ops: changed code is a new compiler)."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    step_source = b"".join(path.read_bytes() for path in _TRACED_SOURCES)
    digest = hashlib.sha256(
        json.dumps(
            {
                "config": (model_dir / "config.json").read_text(),
                "files": [(p.name, p.stat().st_size) for p in files],
                "envelope": envelope.to_dict(),
                "backend": backend,
                "architecture": architecture,
                "versions": library_versions("aotinductor"),
                "step": hashlib.sha256(step_source).hexdigest(),
            },
            sort_keys=True,
        ).encode()
    )
    return digest.hexdigest()[:16]


def build_engine(
    model_dir: Path,
    out_dir: Path,
    envelope: Envelope,
    backend_name: str,
    device: torch.device,
    engine_key: str | None = None,
    progress: Progress = lambda stage, percent: None,
    model_digest: str = "",
    model_commit: str = "",
    keep_digest: str = "",
    keep_existing: bool = False,
) -> Manifest:
    """Builds the engine into out_dir. An intact engine of this key already there is kept when it is the engine of
    keep_digest, or any with keep_existing; otherwise it is replaced. model_digest and model_commit (model_content)
    are recorded in the manifest."""
    backend = get_backend(backend_name)
    backend.check_available(device)
    architecture = device_architecture(device)
    engine_key = engine_key or default_engine_key(model_dir, envelope, backend_name, architecture)
    if (keep_digest or keep_existing) and (out_dir / "manifest.json").is_file():
        existing = _vouched_for(out_dir, engine_key, keep_digest or None)
        if existing is not None:
            progress("done", 100)
            return existing
    started = time.monotonic()
    progress("load", 0)
    loaded = load_model(model_dir, dtype=envelope.dtype, device=device, kernels="reference")
    config = loaded.config
    if envelope.max_context_length > config.max_position_embeddings:
        raise ValueError(
            f"--max-context-length {envelope.max_context_length} exceeds the model's "
            f"max_position_embeddings {config.max_position_embeddings}"
        )
    step = StaticStep(loaded.model, envelope.max_context_length).eval()
    kv_cache = torch.zeros(kv_cache_shape(config, envelope), dtype=config.dtype, device=device)

    # Unique per build: two Jobs of one key (each pid 1 in its pod) must never share a staging directory.
    staging = out_dir.with_name(f".{out_dir.name}.building-{uuid.uuid4().hex}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        manifest = _build_into(
            staging,
            model_dir,
            loaded,
            step,
            kv_cache,
            envelope,
            backend,
            backend_name,
            architecture,
            engine_key,
            started,
            progress,
        )
        if model_digest or model_commit:
            manifest.model_digest, manifest.model_commit = model_digest, model_commit
            write_manifest(staging, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(out_dir)
    except OSError:
        # Another builder of the same key finished first (two Jobs, two test sessions): keep its engine.
        shutil.rmtree(staging, ignore_errors=True)
        if not (out_dir / "manifest.json").is_file() or read_manifest(out_dir).engine_key != engine_key:
            raise
        manifest = read_manifest(out_dir)
    progress("done", 100)
    return manifest


def _vouched_for(out_dir: Path, engine_key: str, digest: str | None) -> Manifest | None:
    """The engine at out_dir when it is of this key, of `digest` (None: any) and still matches its checksums: a
    rebuild after a damaged, replaced or planted engine replaces it."""
    try:
        existing = read_manifest(out_dir, digest)
        verify_checksums(out_dir, existing)
    except EngineMismatch:
        return None
    return existing if existing.engine_key == engine_key else None


def _build_into(
    staging: Path,
    model_dir: Path,
    loaded,
    step,
    kv_cache,
    envelope: Envelope,
    backend,
    backend_name: str,
    architecture: str,
    engine_key: str,
    started: float,
    progress: Progress,
) -> Manifest:
    config = loaded.config
    (staging / "graphs").mkdir(parents=True)
    _copy_model_files(model_dir, staging / "model")
    jobs = [("decode", b) for b in envelope.decode_buckets] + [("prefill", b) for b in envelope.prefill_buckets]
    graphs = []
    for i, (kind, bucket) in enumerate(jobs):
        progress(f"export-{graph_name(kind, bucket)}", 5 + 90 * i // len(jobs))
        rel = f"graphs/{graph_name(kind, bucket)}{backend.FILE_SUFFIX}"
        backend.build(step, example_inputs(kind, bucket, kv_cache), staging / rel)
        graphs.append(GraphEntry(kind, bucket, rel, _size(staging / rel)))
    progress("write", 95)
    graph_bytes = sum(g.num_bytes for g in graphs)
    manifest = Manifest(
        engine_key=engine_key,
        backend=backend_name,
        target_architecture=architecture,
        envelope=envelope,
        versions=library_versions(backend_name),
        model={
            "name": config.name,
            "vocab_size": config.vocab_size,
            "num_layers": config.num_layers,
            "num_kv_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "hidden_size": config.hidden_size,
            "dtype": str(config.dtype).removeprefix("torch."),
        },
        graphs=graphs,
        build_seconds=round(time.monotonic() - started, 2),
        sizes={
            "graph_bytes": graph_bytes,
            "total_bytes": graph_bytes + _size(staging / "model"),
            "kv_cache_bytes": kv_cache.numel() * kv_cache.element_size(),
        },
    )
    manifest.checksums = file_checksums(staging)
    write_manifest(staging, manifest)
    return manifest


def kv_cache_shape(config, envelope: Envelope) -> tuple[int, ...]:
    """[num_layers, 2 (K, V), max_batch_size slots, max_context_length, num_kv_heads, head_dim]."""
    return (
        config.num_layers,
        2,
        envelope.max_batch_size,
        envelope.max_context_length,
        config.num_kv_heads,
        config.head_dim,
    )


def _copy_model_files(model_dir: Path, dest: Path) -> None:
    dest.mkdir()
    for path in model_dir.iterdir():
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and path.name != "model.safetensors.index.json":
            shutil.copy2(path, dest / path.name)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
