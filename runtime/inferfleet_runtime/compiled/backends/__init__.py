"""Compiler backends: each turns a StaticStep at one bucket's shapes into a file and loads it back as a callable.

A backend module exposes NAME, FILE_SUFFIX, check_available(device) -> None (raises BackendUnavailable),
build(step, example_inputs, path) -> None and load(path, device) -> callable(*inputs) -> (logits, new_kv).
"""

from __future__ import annotations

import importlib

BACKENDS = ("aotinductor", "tensorrt")


class BackendUnavailable(RuntimeError):
    """This machine lacks what the backend needs (a library, a GPU)."""


def get_backend(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"inferfleet_runtime.compiled.backends.{name}")
