"""The CRDs: generated from the models, structural, and refusing bad specs with messages that name the field."""

from __future__ import annotations

import copy

import pytest
import yaml
from crd_cases import CASES
from crd_eval import CRDS, admit, compile_all, load_schema

from inferfleet_operator.api import crdgen
from inferfleet_operator.api import types as api

VALID = {
    "apiVersion": "inferfleet.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama", "namespace": "team-a"},
    "spec": {"model": {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B"}},
}


def svc(**spec_changes) -> dict:
    obj = copy.deepcopy(VALID)
    for dotted, value in spec_changes.items():
        node = obj["spec"]
        *parents, last = dotted.split("__")
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
    return obj


@pytest.mark.parametrize("file_name", sorted(crdgen.FILES))
def test_committed_crd_yaml_is_what_crdgen_generates(file_name):
    assert (CRDS / file_name).read_text() == crdgen.render(crdgen.FILES[file_name]), (
        "run: python -m inferfleet_operator.api.crdgen crds/"
    )


@pytest.mark.parametrize("file_name", sorted(crdgen.FILES))
def test_every_cel_rule_and_message_expression_compiles(file_name):
    assert compile_all(load_schema(file_name)) >= 1


def _schema_fields(schema: dict) -> set[str]:
    return set(schema.get("properties", {}))


@pytest.mark.parametrize(
    "cls, path",
    [
        (api.InferenceServiceSpec, ("inferenceservices.yaml", "spec")),
        (api.ModelSpec, ("inferenceservices.yaml", "spec", "model")),
        (api.EngineEnvelope, ("inferenceservices.yaml", "spec", "engine")),
        (api.RuntimeSpec, ("inferenceservices.yaml", "spec", "runtime")),
        (api.Placement, ("inferenceservices.yaml", "spec", "placement")),
        (api.Resources, ("inferenceservices.yaml", "spec", "resources")),
        (api.BuildSpec, ("inferenceservices.yaml", "spec", "build")),
        (api.BuildResources, ("inferenceservices.yaml", "spec", "build", "resources")),
        (api.BuildResources, ("enginebuilds.yaml", "spec", "resources")),
        (api.RoutingSpec, ("inferenceservices.yaml", "spec", "routing")),
        (api.EndpointPicker, ("inferenceservices.yaml", "spec", "routing", "endpointPicker")),
        (api.AutoscalingSpec, ("inferenceservices.yaml", "spec", "autoscaling")),
        (api.InferenceRuntimeSpec, ("inferenceruntimes.yaml", "spec")),
        (api.EngineBuildSpec, ("enginebuilds.yaml", "spec")),
        (api.EngineEnvelope, ("enginebuilds.yaml", "spec", "envelope")),
        (api.BuildPlacement, ("enginebuilds.yaml", "spec", "placement")),
    ],
)
def test_models_and_schema_have_the_same_fields_and_defaults(cls, path):
    schema = load_schema(path[0])
    for name in path[1:]:
        schema = schema["properties"][name]
    fields = {api.to_camel(name): info for name, info in cls.model_fields.items()}
    assert set(fields) == _schema_fields(schema)
    for camel, info in fields.items():
        sub = schema["properties"][camel]
        required = camel in (schema.get("required") or [])
        assert required == info.is_required(), f"{camel}: required in the schema iff the model has no default"
        if "default" in sub and sub.get("type") != "object":
            assert sub["default"] == info.get_default(call_default_factory=True), camel


def test_a_minimal_service_is_admitted_with_every_default_filled():
    stored, errors = admit(VALID, "inferenceservices.yaml")
    assert errors == []
    spec = stored["spec"]
    assert spec["engine"] == {
        "maxContextLength": 4096,
        "maxBatchSize": 16,
        "dtype": "bfloat16",
        "tensorParallelSize": 1,
        "blockSize": 16,
    }
    assert spec["runtime"] == {"policy": "Auto", "fallback": "Paged", "bridge": True}
    assert spec["resources"]["gpusPerReplica"] == 1 and spec["replicas"] == 1
    # The defaulted object parses to the same model as the bare one: defaults live in one place.
    assert api.parse_service(stored).spec == api.parse_service(VALID).spec


REFUSED = [
    (svc(model__uri="http://example.com/model"), "model.uri must be pvc://"),
    (svc(model__uri="pvc://Claim_With_Caps/x"), "model.uri must be pvc://"),
    (svc(model__uri="hf://only-org"), "model.uri must be pvc://"),
    (svc(engine__tensorParallelSize=2), "engine.tensorParallelSize must equal resources.gpusPerReplica"),
    (
        svc(runtime__policy="Paged", runtime__fallback="None"),
        "runtime.fallback None has no effect with runtime.policy Paged",
    ),
    (
        svc(replicas=2, pools=[{"name": "nvidia-h100", "replicas": 3}]),
        "the sum of pools[].replicas must be at most replicas",
    ),
    (
        svc(placement__tolerations=[{"key": "gpu", "operator": "Exists", "value": "x"}]),
        "value must be empty when operator is Exists",
    ),
    (
        svc(autoscaling={"minReplicas": 5, "maxReplicas": 2, "targetWaitingRequests": 4}),
        "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
    ),
    (svc(autoscaling={"maxReplicas": 4}), "autoscaling needs targetWaitingRequests or targetKvCacheUsagePercent"),
    (
        svc(autoscaling={"maxReplicas": 4, "targetWaitingRequests": 2}, pools=[{"name": "cpu-amd64", "replicas": 1}]),
        "pools (fixed per-pool replicas) cannot be combined with autoscaling",
    ),
]


@pytest.mark.parametrize("obj, message", REFUSED)
def test_invalid_service_is_refused_with_a_message_naming_the_field(obj, message):
    _, errors = admit(obj, "inferenceservices.yaml")
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_new_rules_admit_the_valid_and_refuse_the_invalid(case):
    file_name, obj, field, message = CASES[case]
    _, errors = admit(obj, file_name)
    if field is None:
        assert errors == []
    else:
        # Offline, a rule's failure is reported at the node holding it; a schema bound at the field itself.
        assert any(message in e or e.startswith("." + field) for e in errors), errors


@pytest.mark.parametrize(
    "obj, path",
    [
        (svc(engine__dtype="int3"), ".spec.engine.dtype"),
        (svc(engine__blockSize=12), ".spec.engine.blockSize"),
        (svc(engine__maxContextLength=10), ".spec.engine.maxContextLength"),
        (svc(engine__maxBatchSize=0), ".spec.engine.maxBatchSize"),
        (svc(runtime__policy="Fastest"), ".spec.runtime.policy"),
        (svc(placement__vendors=["nvidia", "acme"]), ".spec.placement.vendors[1]"),
        (svc(resources__memory="lots"), ".spec.resources.memory"),
        (
            svc(autoscaling={"minReplicas": 0, "maxReplicas": 2, "targetWaitingRequests": 1}),
            ".spec.autoscaling.minReplicas",
        ),
        (
            svc(autoscaling={"maxReplicas": 2, "targetKvCacheUsagePercent": 150}),
            ".spec.autoscaling.targetKvCacheUsagePercent",
        ),
        (svc(routing={"inferencePool": "Sometimes"}), ".spec.routing.inferencePool"),
        (svc(routing={"endpointPicker": {"name": "epp", "port": 70000}}), ".spec.routing.endpointPicker.port"),
    ],
)
def test_out_of_envelope_values_are_refused_by_the_schema(obj, path):
    _, errors = admit(obj, "inferenceservices.yaml")
    assert any(e.startswith(path) for e in errors), errors


def test_service_name_must_be_a_dns_label_starting_with_a_letter():
    obj = copy.deepcopy(VALID)
    obj["metadata"]["name"] = "9lives"
    _, errors = admit(obj, "inferenceservices.yaml")
    assert any("metadata.name must be a DNS label" in e for e in errors)


def test_consistent_parallelism_and_a_valid_pvc_uri_are_admitted():
    obj = svc(engine__tensorParallelSize=4, resources__gpusPerReplica=4, model__uri="pvc://models/llama/8b")
    assert admit(obj, "inferenceservices.yaml")[1] == []


def test_model_name_cannot_change_but_the_envelope_can():
    renamed = svc(model__name="other")
    _, errors = admit(renamed, "inferenceservices.yaml", old=VALID)
    assert any("model.name is immutable" in e for e in errors)
    bigger = svc(engine__maxContextLength=8192)
    assert admit(bigger, "inferenceservices.yaml", old=VALID)[1] == []


def _build(**spec) -> dict:
    base = {
        "engineKey": "0123456789abcdef", "modelUri": "hf://org/m", "revision": "main", "envelope": {},
        "vendor": "nvidia", "architecture": "sm90", "image": "r:1", "compileImage": "c:1",
    }  # fmt: skip
    return {"metadata": {"name": "0123456789abcdef"}, "spec": base | spec}


def test_engine_build_spec_is_immutable_except_placement():
    old = _build()
    _, errors = admit(_build(architecture="sm80"), "enginebuilds.yaml", old=old)
    assert any("architecture is immutable" in e for e in errors)
    _, errors = admit(_build(envelope={"maxBatchSize": 64}), "enginebuilds.yaml", old=old)
    assert any("envelope is immutable" in e for e in errors)
    assert admit(_build(placement={"nodeNames": ["n1"]}), "enginebuilds.yaml", old=old)[1] == []


def test_engine_build_name_must_be_its_key():
    obj = _build()
    obj["metadata"]["name"] = "something-else"
    assert any("metadata.name must equal spec.engineKey" in e for e in admit(obj, "enginebuilds.yaml")[1])


def test_compiled_runtime_needs_a_compile_image_and_paged_refuses_one():
    compiled = {"metadata": {"name": "trt"}, "spec": {"engine": "Compiled", "vendors": ["nvidia"], "image": "r:1"}}
    assert any("compileImage is required" in e for e in admit(compiled, "inferenceruntimes.yaml")[1])
    paged = {
        "metadata": {"name": "p"},
        "spec": {"engine": "Paged", "vendors": ["amd"], "image": "r:1", "compileImage": "c:1"},
    }
    assert any("compileImage is only used by engine Compiled" in e for e in admit(paged, "inferenceruntimes.yaml")[1])
    empty_vendors = {"metadata": {"name": "p"}, "spec": {"engine": "Paged", "vendors": [], "image": "r:1"}}
    assert any(e.startswith(".spec.vendors") for e in admit(empty_vendors, "inferenceruntimes.yaml")[1])
    good = {"metadata": {"name": "p"}, "spec": {"engine": "Paged", "vendors": ["amd"], "image": "r:1"}}
    assert admit(good, "inferenceruntimes.yaml")[1] == []


@pytest.mark.parametrize(
    "file_name, short, scope, columns",
    [
        (
            "inferenceservices.yaml",
            "infsvc",
            "Namespaced",
            ["Ready", "Pools", "Runtimes", "Endpoint", "Routing", "Age"],
        ),
        ("inferenceruntimes.yaml", "infrt", "Cluster", ["Engine", "Vendors", "Priority", "Age"]),
        ("enginebuilds.yaml", "eb", "Namespaced", ["State", "Attempts", "Arch", "Progress", "Age"]),
    ],
)
def test_crds_have_short_names_scope_status_subresource_and_printer_columns(file_name, short, scope, columns):
    crd = yaml.safe_load((CRDS / file_name).read_text())
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == [short] and crd["spec"]["scope"] == scope
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns


def _defaults(schema: dict, path: str = ""):
    if "default" in schema:
        yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _defaults(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _defaults(schema["items"], f"{path}[]")


@pytest.mark.parametrize("file_name", sorted(crdgen.FILES))
def test_every_default_passes_its_own_rules_before_nested_defaulting(file_name):
    # The API server checks a default value against the rules as written, without filling nested defaults.
    from crd_eval import rule_failures

    for path, sub in _defaults(load_schema(file_name)):
        assert rule_failures(sub["default"], sub, path=path) == [], path


def test_documented_example_service_is_admitted_and_plans():
    import re

    from planning_data import NOW, RUNTIMES, h100, mi300x

    from inferfleet_operator.plan.planner import plan_service

    page = (CRDS.parent / "docs" / "user-guide" / "resources.md").read_text()
    section = page.split("## InferenceService", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    stored, errors = admit(example, "inferenceservices.yaml")
    assert errors == []
    p = plan_service(stored, [h100("h1"), mi300x("m1")], RUNTIMES, {}, {}, NOW)
    assert {e["name"]: e["desiredReplicas"] for e in p.status["pools"]} == {"amd-mi300x": 1, "nvidia-h100-80gb-hbm3": 3}


def test_one_field_declaration_gives_the_schema_node_and_the_parsed_value():
    from pydantic import StrictInt

    from inferfleet_operator.api.schema import Model, field, openapi, parse, rule

    class Knob(Model):
        """A knob."""

        RULES = (rule("self.turns >= 0", "turns must not be negative"),)

        turns: StrictInt = field(3, "How far.", bounds=(0, 10), rules=[rule("self != 7", "not 7")])
        label: str = field(..., "Its name.", pattern="^[a-z]+$", max_length=8)
        tags: tuple[str, ...] = field((), "Tags.", items={"description": "Tag.", "enum": ["a", "b"]}, max_items=2)

    assert openapi(Knob) == {
        "type": "object",
        "description": "A knob.",
        "properties": {
            "turns": {"type": "integer", "description": "How far.", "minimum": 0, "maximum": 10, "default": 3,
                      "x-kubernetes-validations": [{"rule": "self != 7", "message": "not 7"}]},
            "label": {"type": "string", "description": "Its name.", "pattern": "^[a-z]+$", "maxLength": 8},
            "tags": {"type": "array", "description": "Tags.", "items": {"type": "string", "description": "Tag.", "enum": ["a", "b"]},
                     "maxItems": 2, "x-kubernetes-list-type": "atomic"},
        },
        "required": ["label"],
        "x-kubernetes-validations": [{"rule": "self.turns >= 0", "message": "turns must not be negative"}],
    }  # fmt: skip
    knob = parse(Knob, {"label": "x", "tags": ["a"]})
    assert (knob.turns, knob.label, knob.tags) == (3, "x", ("a",))
    with pytest.raises(api.SpecError, match=r"^spec\.turns must be an integer$"):
        parse(Knob, {"label": "x", "turns": "3"})
