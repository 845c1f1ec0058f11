"""Stand-in compile backends for the build orchestration: small files written in place of compiled graphs."""

from __future__ import annotations

import types


def stand_in_backend(fail_at: str | None = None):
    """A compile backend that records what it builds and writes small files; fails on a file whose name holds fail_at."""
    built = []

    def build(step, example_inputs, path):
        if fail_at and fail_at in path.name:
            raise RuntimeError("compiler crashed")
        built.append((path.name, tuple(example_inputs[0].shape)))
        path.write_bytes(b"graph" * 10)

    return types.SimpleNamespace(
        FILE_SUFFIX=".pt2", check_available=lambda device: None, build=build, load=None, built=built
    )
