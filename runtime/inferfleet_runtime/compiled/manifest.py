"""manifest.json of an engine directory: what was built, for which hardware and versions; the check before serving.

What is trusted: the engine digest (engine_digest, sha256 over the manifest's canonical JSON), which the compile Job
reports and the operator keeps in the EngineBuild's status. The manifest names every file of the directory with its
sha256, so the digest pins every byte the runtime loads; checksums in the folder alone only show that the folder is
consistent, not who wrote it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from .envelope import Envelope

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 2  # 2: checksums of every artifact
# Names other tools use for the same CPU targets (Kubernetes node architectures, uname).
_CPU_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


# `serve --engine-dir` exits with this code when the engine is missing or damaged (no manifest, an artifact missing or
# not matching its checksum): a rebuild fixes it, and the operator starts one when a serving pod exits so.
ENGINE_LOST_EXIT_CODE = 3


class EngineMismatch(ValueError):
    """The engine directory cannot be served here: other hardware, other versions, or an unreadable manifest."""


class EngineLost(EngineMismatch):
    """The engine directory is gone, or an artifact of it is missing or changed since the build (or the directory
    holds another engine than the one expected, or files its manifest does not cover): rebuild it."""


DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")  # engine_digest's form


@dataclass
class GraphEntry:
    kind: str  # "decode" (bucket = batch size) or "prefill" (bucket = chunk length)
    bucket: int
    file: str  # relative to the engine directory
    num_bytes: int = 0


@dataclass
class Manifest:
    engine_key: str
    backend: str  # "aotinductor" | "tensorrt"
    target_architecture: str  # "cpu-x86_64", "sm90", "gfx942", ...
    envelope: Envelope
    versions: dict[str, str]  # torch, inferfleet, and tensorrt for TensorRT engines
    model: dict  # name, vocab_size, num_layers, num_kv_heads, head_dim, hidden_size
    graphs: list[GraphEntry] = field(default_factory=list)
    build_seconds: float = 0.0
    sizes: dict[str, int] = field(default_factory=dict)  # total_bytes, graph_bytes, kv_cache_bytes
    checksums: dict[str, str] = field(default_factory=dict)  # every other file of the directory -> sha256
    model_digest: str = ""  # the model's content digest (model_content), "" when built without --content-addressed
    model_commit: str = ""  # the hub commit the model was fetched at, "" when not from a hub
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        d = asdict(self)
        d["envelope"] = self.envelope.to_dict()
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        d["envelope"] = Envelope.from_dict(d["envelope"])
        d["graphs"] = [GraphEntry(**g) for g in d.get("graphs", [])]
        return cls(**d)

    def graph(self, kind: str, bucket: int) -> GraphEntry:
        return next(g for g in self.graphs if g.kind == kind and g.bucket == bucket)


def engine_digest(manifest: Manifest) -> str:
    """sha256:<hex> over the manifest's canonical JSON (what write_manifest writes): its checksums cover every other
    file of the engine, so this one value pins the whole engine."""
    return "sha256:" + hashlib.sha256(manifest.to_json().encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(engine_dir: Path) -> dict[str, str]:
    """sha256 of every file under engine_dir but the manifest, by path relative to it."""
    files = sorted(
        p for p in engine_dir.rglob("*") if p.is_file() and p.relative_to(engine_dir).as_posix() != MANIFEST_NAME
    )
    return {path.relative_to(engine_dir).as_posix(): _sha256(path) for path in files}


def artifact_path(engine_dir: str | Path, manifest: Manifest, name: str) -> Path:
    """engine_dir / name for a file the manifest names, refused (EngineLost) when name is absolute, leaves the
    directory, or is not one its checksums cover: the runtime loads nothing else."""
    root = Path(engine_dir)
    path = root / name
    relative = Path(name)
    if (
        not name
        or relative.is_absolute()
        or ".." in relative.parts
        or not path.resolve().is_relative_to(root.resolve())
    ):
        raise EngineLost(
            f"engine {manifest.engine_key} names {name!r}, outside the engine directory; rebuild the engine"
        )
    if name not in manifest.checksums:
        raise EngineLost(f"engine {manifest.engine_key}: {name} is not covered by its checksums; rebuild the engine")
    return path


def _files_in(engine_dir: Path, manifest: Manifest) -> set[str]:
    """The files under engine_dir (relative, posix), refusing symlinks: a link's target is outside what was checked."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(engine_dir):  # does not follow links to directories
        for entry in dirnames + filenames:
            path = Path(dirpath) / entry
            name = path.relative_to(engine_dir).as_posix()
            if path.is_symlink():
                raise EngineLost(f"engine {manifest.engine_key}: {name} is a symlink; rebuild the engine")
            if entry in filenames:
                if not path.is_file():
                    raise EngineLost(f"engine {manifest.engine_key}: {name} is not a regular file; rebuild the engine")
                found.add(name)
    return found


def verify_checksums(engine_dir: str | Path, manifest: Manifest) -> None:
    """Raises EngineLost unless the directory holds exactly the files the manifest's checksums list, each with its
    checksum, every graph among them, none a symlink or outside it: a half-written, truncated, replaced or added
    file is never loaded (graphs are native code; the model folder is read by listing it). Whether the manifest is
    the one that was built is engine_digest's question (read_manifest's expected_digest)."""
    engine_dir = Path(engine_dir)
    if not manifest.checksums:
        raise EngineLost(f"engine {manifest.engine_key} lists no artifact checksums; rebuild the engine")
    present = _files_in(engine_dir, manifest) - {MANIFEST_NAME}
    for name in sorted(manifest.checksums):
        artifact_path(engine_dir, manifest, name)
    for graph in manifest.graphs:
        artifact_path(engine_dir, manifest, graph.file)
    uncovered = sorted(present - set(manifest.checksums))
    if uncovered:
        raise EngineLost(
            f"engine {manifest.engine_key}: {uncovered[0]} is not covered by its checksums; rebuild the engine"
        )
    for name, expected in sorted(manifest.checksums.items()):
        if name not in present:
            raise EngineLost(f"engine {manifest.engine_key} lacks its artifact {name}; rebuild the engine")
        if _sha256(engine_dir / name) != expected:
            raise EngineLost(
                f"engine {manifest.engine_key}: {name} does not match its checksum (changed or truncated since the "
                "build); rebuild the engine"
            )


def write_manifest(engine_dir: Path, manifest: Manifest) -> None:
    (engine_dir / MANIFEST_NAME).write_text(manifest.to_json())


def read_manifest(engine_dir: str | Path, expected_digest: str | None = None) -> Manifest:
    """The manifest of engine_dir; with expected_digest (the one its EngineBuild recorded), EngineLost unless it is
    that engine's: an engine put there by anyone else who can write the cache is not loaded."""
    path = Path(engine_dir) / MANIFEST_NAME
    try:
        manifest = Manifest.from_json(path.read_text())
    except FileNotFoundError:
        raise EngineLost(f"{engine_dir} is not a compiled engine directory (no {MANIFEST_NAME})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineMismatch(f"{path} is not a readable engine manifest: {exc}") from None
    if expected_digest is not None:
        if not DIGEST_PATTERN.match(expected_digest):
            raise EngineMismatch(f"expected an engine digest sha256:<64 hex digits>, got {expected_digest!r}")
        actual = engine_digest(manifest)
        if actual != expected_digest:
            raise EngineLost(
                f"{engine_dir} is not the engine of digest {expected_digest} (its manifest's digest is {actual}): it "
                "was replaced or changed since the build; rebuild the engine"
            )
    return manifest


def inferfleet_version() -> str:
    try:
        return metadata.version("inferfleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def library_versions(backend: str) -> dict[str, str]:
    versions = {"torch": torch.__version__, "inferfleet": inferfleet_version()}
    if backend == "tensorrt":
        import tensorrt

        versions["tensorrt"] = tensorrt.__version__
    return versions


def device_architecture(device: torch.device) -> str:
    """ "sm90" for an NVIDIA GPU, "gfx942" for an AMD one (ROCm), "cpu-x86_64" / "cpu-aarch64" for the CPU."""
    if device.type == "cuda":
        if getattr(torch.version, "hip", None):
            return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"
    if device.type == "cpu":
        return f"cpu-{_CPU_ALIASES.get(platform.machine().lower(), platform.machine().lower())}"
    return device.type


def normalize_architecture(name: str) -> str:
    """Maps the operator's node architectures ("amd64", "arm64", "cpu") onto manifest names ("cpu-x86_64")."""
    lowered = name.strip().lower()
    if lowered == "cpu":
        return device_architecture(torch.device("cpu"))
    if lowered in _CPU_ALIASES:
        return f"cpu-{_CPU_ALIASES[lowered]}"
    return lowered


def check_compatible(manifest: Manifest, device: torch.device) -> None:
    """Raises EngineMismatch (one line saying what differs) unless this process can serve the engine on device."""
    if manifest.format_version != FORMAT_VERSION:
        raise EngineMismatch(
            f"engine {manifest.engine_key} has manifest format {manifest.format_version}, this "
            f"runtime reads format {FORMAT_VERSION}; rebuild the engine"
        )
    here = device_architecture(device)
    if manifest.target_architecture != here:
        raise EngineMismatch(
            f"engine {manifest.engine_key} was built for {manifest.target_architecture}, this "
            f"machine is {here}; rebuild the engine for {here}"
        )
    mine = {"torch": torch.__version__, "inferfleet": inferfleet_version()}
    if manifest.backend == "tensorrt":
        try:
            import tensorrt

            mine["tensorrt"] = tensorrt.__version__
        except ImportError:
            mine["tensorrt"] = "not installed"
    for library, version in mine.items():
        built = manifest.versions.get(library)
        if built != version:
            raise EngineMismatch(
                f"engine {manifest.engine_key} was built with {library} {built}, this runtime has "
                f"{library} {version}; rebuild the engine"
            )
