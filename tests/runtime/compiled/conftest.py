"""The built-in model compiled once with aotinductor, cached under $INFERFLEET_CACHE by engine key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tiny on purpose: every graph costs tens of seconds of C++ compile on a small CPU. Three graphs:
# decode batches 2 and 4 (so 1 or 3 running sequences are padded), prompt chunks up to 16 tokens.
TEST_ENVELOPE = dict(
    max_context_length=64, max_batch_size=4, dtype="float32", decode_buckets=(2, 4), prefill_buckets=(16,)
)


def _cache_root() -> Path:
    return Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet") / "compiled-engines"


@pytest.fixture(scope="session")
def compiled_demo_engine(demo_model_dir) -> Path:
    """Engine directory of the demo model for TEST_ENVELOPE; built through the CLI only when not cached."""
    import torch

    from inferfleet_runtime.cli import main
    from inferfleet_runtime.compiled.envelope import Envelope
    from inferfleet_runtime.compiled.export import default_engine_key
    from inferfleet_runtime.compiled.manifest import device_architecture

    envelope = Envelope(**TEST_ENVELOPE)
    key = default_engine_key(demo_model_dir, envelope, "aotinductor", device_architecture(torch.device("cpu")))
    out = _cache_root() / key
    if not (out / "manifest.json").is_file():
        code = main(
            [
                "compile",
                "--model",
                str(demo_model_dir),
                "--out",
                str(out),
                "--backend",
                "aotinductor",
                "--device",
                "cpu",
                "--max-context-length",
                str(envelope.max_context_length),
                "--max-batch-size",
                str(envelope.max_batch_size),
                "--dtype",
                envelope.dtype,
                "--decode-buckets",
                ",".join(map(str, envelope.decode_buckets)),
                "--prefill-buckets",
                ",".join(map(str, envelope.prefill_buckets)),
            ]
        )
        assert code == 0, "compiling the demo model failed (see the captured output)"
    return out
