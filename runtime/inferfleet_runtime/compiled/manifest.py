"""manifest.json of an engine directory: what was built, for which hardware and versions; the check before serving."""

from __future__ import annotations

import hashlib
import json
import platform
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
    """The engine directory is gone, or an artifact of it is missing or changed since the build: rebuild it."""


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


def file_checksums(engine_dir: Path) -> dict[str, str]:
    """sha256 of every file under engine_dir but the manifest, by path relative to it."""
    sums = {}
    for path in sorted(p for p in engine_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        sums[path.relative_to(engine_dir).as_posix()] = digest.hexdigest()
    return sums


def verify_checksums(engine_dir: str | Path, manifest: Manifest) -> None:
    """Raises EngineMismatch unless every artifact the manifest lists is there with its recorded checksum: a
    half-written, truncated or replaced file is never loaded (graphs are native code)."""
    engine_dir = Path(engine_dir)
    if not manifest.checksums:
        raise EngineLost(f"engine {manifest.engine_key} lists no artifact checksums; rebuild the engine")
    for name, expected in sorted(manifest.checksums.items()):
        path = engine_dir / name
        if ".." in Path(name).parts or Path(name).is_absolute() or not path.is_file():
            raise EngineLost(f"engine {manifest.engine_key} lacks its artifact {name}; rebuild the engine")
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise EngineLost(
                f"engine {manifest.engine_key}: {name} does not match its checksum (changed or truncated since the "
                "build); rebuild the engine"
            )


def write_manifest(engine_dir: Path, manifest: Manifest) -> None:
    (engine_dir / MANIFEST_NAME).write_text(manifest.to_json())


def read_manifest(engine_dir: str | Path) -> Manifest:
    path = Path(engine_dir) / MANIFEST_NAME
    try:
        return Manifest.from_json(path.read_text())
    except FileNotFoundError:
        raise EngineLost(f"{engine_dir} is not a compiled engine directory (no {MANIFEST_NAME})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineMismatch(f"{path} is not a readable engine manifest: {exc}") from None


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
