"""The operator's compile Job and compiled serving pod run commands this CLI accepts, flag for flag."""

from __future__ import annotations

import argparse
import json

from inferfleet_operator.api.types import EngineBuildSpec, EngineEnvelope, PlanSettings
from inferfleet_operator.plan.build_jobs import compile_job_for
from inferfleet_runtime.cli import main

from ..runtime.support.compile_backends import stand_in_backend


def _job_args(spec: EngineBuildSpec) -> list[str]:
    job = compile_job_for("build-1", "team-a", spec, 1, PlanSettings())
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["inferfleet-runtime"]
    return list(container["args"])


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return args[: i + 1] + [value] + args[i + 2 :]


def test_compile_job_args_build_an_engine_with_the_operators_key(demo_model_dir, tmp_path, monkeypatch, capsys):
    from inferfleet_runtime.compiled import export

    backend = stand_in_backend()
    monkeypatch.setattr(export, "get_backend", lambda name: backend)
    spec = EngineBuildSpec(
        engine_key="0123abcd",
        model_uri="file:///data/demo",
        revision="main",
        envelope=EngineEnvelope(max_context_length=128, max_batch_size=4, dtype="float32"),
        vendor="cpu",
        architecture="amd64",
        image="runtime:1",
        compile_image="runtime:1",
    )
    args = _job_args(spec)
    assert args[0] == "compile" and args[args.index("--backend") + 1] == "aotinductor"
    args = _replace(_replace(args, "--model", str(demo_model_dir)), "--out", str(tmp_path / "0123abcd"))
    assert main(args + ["--device", "cpu"]) == 0
    from inferfleet_runtime.fetch.content_digest import content_digest, content_manifest

    digest = content_digest(content_manifest(demo_model_dir))  # --content-addressed: under the model's digest
    manifest = json.loads((tmp_path / "0123abcd" / digest / "manifest.json").read_text())
    assert manifest["engine_key"] == "0123abcd"
    assert manifest["envelope"]["max_context_length"] == 128 and manifest["envelope"]["max_batch_size"] == 4
    assert capsys.readouterr().out.splitlines()[-1].startswith("built engine=0123abcd")


def test_nvidia_compile_job_asks_for_tensorrt_and_parses(demo_model_dir):
    spec = EngineBuildSpec(
        engine_key="k",
        model_uri="file:///data/demo",
        revision="main",
        envelope=EngineEnvelope(),
        vendor="nvidia",
        architecture="sm90",
        image="i",
        compile_image="i",
    )
    args = _job_args(spec)
    parser = argparse.ArgumentParser()
    from inferfleet_runtime.compiled import cli as compile_cli

    compile_cli.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    assert (parsed.backend, parsed.target_architecture, parsed.dtype) == ("tensorrt", "sm90", "bfloat16")
    assert (parsed.max_context_length, parsed.max_batch_size, parsed.tensor_parallel_size) == (4096, 16, 1)


def test_the_exit_code_of_a_lost_engine_is_the_one_the_operator_rebuilds_on():
    from inferfleet_operator.plan.findings import ENGINE_LOST_EXIT_CODE as OPERATOR_CODE
    from inferfleet_runtime.compiled.manifest import ENGINE_LOST_EXIT_CODE

    assert OPERATOR_CODE == ENGINE_LOST_EXIT_CODE == 3


def test_the_prune_job_removes_the_directory_the_compile_job_wrote(tmp_path):
    from inferfleet_operator.plan.build_jobs import prune_job_for
    from inferfleet_runtime.compiled import prune as prune_engine
    from inferfleet_runtime.compiled.manifest import MANIFEST_NAME

    assert prune_engine.MANIFEST_NAME == MANIFEST_NAME
    job = prune_job_for("team-a", "0123abcd", "00ff00ff00ff00ff", "runtime:1", PlanSettings())
    [container] = job["spec"]["template"]["spec"]["containers"]
    engine = tmp_path / "0123abcd" / "00ff00ff00ff00ff"
    engine.mkdir(parents=True)
    (engine / MANIFEST_NAME).write_text("{}")
    args = [a.replace("/engines", str(tmp_path)) for a in container["args"]]
    assert main(args) == 0 and not engine.exists()


def test_a_rebuilds_recorded_digest_and_a_shared_caches_keep_flag_parse():
    from inferfleet_runtime.compiled import cli as compile_cli

    spec = EngineBuildSpec(
        engine_key="k",
        model_uri="file:///data/demo",
        revision="main",
        envelope=EngineEnvelope(),
        vendor="cpu",
        architecture="amd64",
        image="i",
        compile_image="i",
    )
    parser = argparse.ArgumentParser()
    compile_cli.add_arguments(parser)
    digest = "sha256:" + "ab" * 32

    def parsed(settings: PlanSettings, **kw):
        [container] = compile_job_for("k", "team-a", spec, 2, settings, **kw)["spec"]["template"]["spec"]["containers"]
        return parser.parse_args(container["args"][1:])

    rebuild = parsed(PlanSettings(), engine_digest=digest)
    assert (rebuild.engine_digest, rebuild.keep_existing) == (digest, False)
    first = parsed(PlanSettings())
    assert (first.engine_digest, first.keep_existing) == (None, False)
    assert parsed(PlanSettings(share_engines_across_namespaces=True)).keep_existing
