"""api: camelCase specs parse into typed models with defaults; bad input names the field."""

from __future__ import annotations

import pytest
from planning_data import service

from inferfleet_operator.api.types import (
    EngineEnvelope,
    SpecError,
    from_dict,
    parse_build,
    parse_runtime,
    parse_service,
    to_camel,
    to_dict,
)


def test_camel_case_maps_to_snake_case_in_one_rule():
    assert to_camel("max_context_length") == "maxContextLength" and to_camel("replicas") == "replicas"


def test_service_spec_parses_with_defaults_and_nested_models():
    s = parse_service(
        service(
            placement={"vendors": ["amd"], "tolerations": [{"key": "k", "operator": "Exists"}]},
            pools=[{"name": "amd-mi300x", "replicas": 2}],
        )
    )
    assert s.meta.name == "llama" and s.meta.generation == 1
    assert s.spec.placement.vendors == ("amd",) and s.spec.placement.tolerations[0].operator == "Exists"
    assert s.spec.pools[0].replicas == 2 and s.spec.engine == EngineEnvelope()


def test_round_trip_through_dict_keeps_every_field():
    env = EngineEnvelope(max_context_length=8192, dtype="float16")
    assert from_dict(EngineEnvelope, to_dict(env)) == env


@pytest.mark.parametrize(
    "obj, field",
    [
        ({"spec": {"model": {"uri": "hf://a/b"}}}, "spec.model.name is required"),
        ({"spec": {"model": {"name": "m", "uri": "hf://a/b"}, "replicas": "two"}}, "spec.replicas must be an integer"),
        ({"spec": {"model": {"name": "m", "uri": "ftp://x"}}}, "spec.model.uri"),
        (
            {"spec": {"model": {"name": "m", "uri": "hf://a/b"}, "runtime": {"bridge": "yes"}}},
            "spec.runtime.bridge must be true or false",
        ),
        (
            {
                "spec": {
                    "model": {"name": "m", "uri": "hf://a/b"},
                    "replicas": 2,
                    "pools": [{"name": "a", "replicas": 2}, {"name": "b", "replicas": 1}],
                }
            },
            "spec.pools: the sum of pools",
        ),
    ],
)
def test_bad_specs_raise_spec_error_naming_the_field(obj, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_service(obj)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"placement": {"tolerations": [{"key": "k"}, {"tolerationSeconds": "60"}]}},
         "spec.placement.tolerations[1].tolerationSeconds must be an integer"),
        ({"placement": {"tolerations": "k"}}, "spec.placement.tolerations must be a list"),
        ({"placement": {"nodeSelector": ["a"]}}, "spec.placement.nodeSelector must be an object"),
        ({"routing": {"endpointPicker": {"name": "epp"}}}, "spec.routing.endpointPicker.port is required"),
        ({"autoscaling": {"maxReplicas": True, "targetWaitingRequests": 1}}, "spec.autoscaling.maxReplicas must be an integer"),
        ({"engine": "big"}, "spec.engine must be an object"),
    ],
)  # fmt: skip
def test_nested_errors_name_the_whole_field_path(spec, message):
    with pytest.raises(SpecError) as error:
        parse_service({"spec": {"model": {"name": "m", "uri": "hf://a/b"}} | spec})
    assert str(error.value) == message


def test_null_fields_read_as_absent_and_maps_round_trip_sorted():
    spec = parse_service(
        {"spec": {"model": {"name": "m", "uri": "hf://a/b", "revision": None}, "replicas": None,
                  "placement": {"nodeSelector": {"z": "1", "a": "2"}}}}
    ).spec  # fmt: skip
    assert (spec.model.revision, spec.replicas) == ("main", 1)
    assert list(to_dict(spec)["placement"]["nodeSelector"]) == ["a", "z"]
    assert from_dict(type(spec), to_dict(spec)) == spec


def test_compiled_runtime_without_compile_image_is_refused():
    with pytest.raises(SpecError, match="compileImage"):
        parse_runtime({"metadata": {"name": "x"}, "spec": {"engine": "Compiled", "vendors": ["nvidia"], "image": "i"}})


def test_build_spec_parses():
    b = parse_build({"metadata": {"name": "k"}, "spec": {"engineKey": "k", "modelUri": "hf://a/b", "revision": "main", "envelope": {},
                     "vendor": "nvidia", "architecture": "sm90", "image": "i", "compileImage": "c"}})  # fmt: skip
    assert b.spec.max_attempts == 3 and b.spec.placement.node_names == ()
    # Builds written before the build settings existed parse with the defaults.
    assert (b.spec.deadline_seconds, b.spec.resources.memory, b.spec.credentials_secret, b.spec.model_size) == (
        7200,
        "16Gi",
        "",
        "",
    )


def test_new_service_fields_parse_with_defaults():
    spec = parse_service(service()).spec
    assert (spec.model.size, spec.model.credentials_secret, spec.placement.tolerate_gpu_taints) == ("", "", True)
    assert (spec.build.deadline_seconds, spec.build.resources.cpu, spec.build.resources.memory) == (7200, "2", "16Gi")
