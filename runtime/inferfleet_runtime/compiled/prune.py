"""`inferfleet-runtime prune-engine --dir DIR`: remove one compiled engine directory from the engine cache.

What the operator's prune Job runs when it garbage-collects an EngineBuild. It removes only a compiled engine (a
directory holding manifest.json, not a symlink), makes it disappear at once (renamed aside, then deleted, so a
reader sees the whole engine or none), then the key's directory above it if that is left empty. A directory that is
already gone is success (exit 0); anything else that is not an engine is refused (exit 2) and left as it is.
"""

from __future__ import annotations

import argparse
import shutil
import uuid
from pathlib import Path

from inferfleet_runtime.termination import fail

MANIFEST_NAME = "manifest.json"  # inferfleet_runtime.compiled.manifest.MANIFEST_NAME (not imported: no torch here)
PROG = "inferfleet-runtime prune-engine"


class NotAnEngine(ValueError):
    """The directory is not a compiled engine: nothing is removed."""


def prune(engine_dir: Path) -> bool:
    """Removes engine_dir (and its parent when left empty); False when it did not exist."""
    if engine_dir.is_symlink():
        raise NotAnEngine(f"{engine_dir} is a symlink, not an engine directory")
    if not engine_dir.exists():
        return False
    if not engine_dir.is_dir() or not (engine_dir / MANIFEST_NAME).is_file():
        raise NotAnEngine(f"{engine_dir} is not a compiled engine directory (no {MANIFEST_NAME}); left as it is")
    aside = engine_dir.with_name(f".{engine_dir.name}.removing-{uuid.uuid4().hex}")
    engine_dir.rename(aside)
    shutil.rmtree(aside)
    try:
        engine_dir.parent.rmdir()  # the key's directory, when this was its last engine
    except OSError:
        pass  # not empty (another digest of the key), or the cache root itself
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", required=True, type=Path, help="the engine directory to remove")


def run(args: argparse.Namespace) -> int:
    try:
        removed = prune(args.dir)
    except NotAnEngine as exc:
        return fail(PROG, str(exc), 2)
    print(f"{'removed' if removed else 'already gone'}: {args.dir}", flush=True)
    return 0
