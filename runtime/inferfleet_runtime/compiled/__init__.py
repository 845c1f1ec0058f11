"""Compiled engines: ahead-of-time graphs for a fixed envelope over static KV buffers, served by the same engine."""

from __future__ import annotations

from pathlib import Path

from .manifest import EngineMismatch, check_compatible, read_manifest, verify_checksums


def runner_factory(engine_dir: str | Path, config, expected_digest: str | None = None):
    """make_runner() for the server; checks the manifest first (raises EngineMismatch, a ValueError, on a mismatch;
    EngineLost when the engine is not the one of expected_digest or its files do not match the manifest) and fits
    config to the envelope before the engine is built from it."""
    import torch

    from .runner import CompiledModelRunner, _manifest_device, fit_engine_config

    manifest = read_manifest(engine_dir, expected_digest)  # first: nothing an unknown manifest says is believed
    device = torch.device(config.device) if config.device else _manifest_device(manifest)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineMismatch(
            f"engine {manifest.engine_key} was built for {manifest.target_architecture}, this machine has no GPU"
        )
    check_compatible(manifest, device)
    verify_checksums(engine_dir, manifest)  # before any of its native code is loaded
    fit_engine_config(manifest, config)

    def make() -> CompiledModelRunner:
        return CompiledModelRunner(engine_dir, config, device, manifest=manifest)

    return make


__all__ = ["EngineMismatch", "check_compatible", "read_manifest", "runner_factory"]
