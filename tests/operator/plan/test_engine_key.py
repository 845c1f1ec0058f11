"""engine_key: canonical (field order and defaulting do not change it), and every input that matters changes it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inferfleet_operator.api.types import EngineEnvelope
from inferfleet_operator.plan.engine_key import KEY_LENGTH, engine_key

ARGS = ("hf://org/model", "main", {}, "sm90", "compile=c:1;serve=r:1")


def test_key_is_short_lowercase_hex():
    key = engine_key(*ARGS)
    assert len(key) == KEY_LENGTH and all(ch in "0123456789abcdef" for ch in key)


def test_spelled_out_defaults_give_the_same_key_as_none():
    explicit = {
        "maxContextLength": 4096,
        "maxBatchSize": 16,
        "dtype": "bfloat16",
        "tensorParallelSize": 1,
        "blockSize": 16,
    }
    assert engine_key("hf://org/model", "main", explicit, "sm90", ARGS[4]) == engine_key(*ARGS)
    assert engine_key("hf://org/model", "main", EngineEnvelope(), "sm90", ARGS[4]) == engine_key(*ARGS)


@given(st.permutations(["maxContextLength", "maxBatchSize", "dtype", "tensorParallelSize", "blockSize"]))
def test_field_order_does_not_change_the_key(order):
    values = {
        "maxContextLength": 8192,
        "maxBatchSize": 32,
        "dtype": "float16",
        "tensorParallelSize": 2,
        "blockSize": 32,
    }
    reordered = {k: values[k] for k in order}
    assert engine_key("hf://o/m", "v1", reordered, "sm90", "x") == engine_key("hf://o/m", "v1", values, "sm90", "x")


def test_each_input_changes_the_key():
    base = engine_key(*ARGS)
    variants = [
        ("hf://org/other", "main", {}, "sm90", ARGS[4]),
        ("hf://org/model", "v2", {}, "sm90", ARGS[4]),
        ("hf://org/model", "main", {"maxContextLength": 8192}, "sm90", ARGS[4]),
        ("hf://org/model", "main", {"dtype": "float16"}, "sm90", ARGS[4]),
        ("hf://org/model", "main", {}, "sm80", ARGS[4]),
        ("hf://org/model", "main", {}, "sm90", "compile=c:2;serve=r:1"),
    ]
    keys = {engine_key(*v) for v in variants}
    assert base not in keys and len(keys) == len(variants)


def test_runtime_quantization_changes_the_key_and_the_checkpoints_own_weights_do_not():
    assert engine_key(*ARGS, "Auto") == engine_key(*ARGS) == engine_key(*ARGS, "None")
    keys = {engine_key(*ARGS), engine_key(*ARGS, "Int8"), engine_key(*ARGS, "Int4")}
    assert len(keys) == 3


def test_the_namespace_enters_the_key_so_two_namespaces_never_share_an_engine_directory():
    keys = {engine_key(*ARGS, namespace="team-a"), engine_key(*ARGS, namespace="team-b"), engine_key(*ARGS)}
    assert len(keys) == 3
    # Quantization and namespace are independent inputs.
    assert engine_key(*ARGS, "Int8", namespace="team-a") != engine_key(*ARGS, "Int8", namespace="team-b")


def test_the_key_without_a_namespace_is_the_key_engines_had_before_the_namespace_entered_it():
    # Shared across namespaces (the administrator's choice) the key is what it was, so those engines stay valid.
    assert engine_key(*ARGS, namespace="") == "b706bb74d07f3c6e" == engine_key(*ARGS)


def test_services_of_two_namespaces_build_apart_unless_the_administrator_shares_engines():
    from planning_data import NOW, RUNTIMES, h100, service

    from inferfleet_operator.api.types import DEFAULT_SETTINGS, PlanSettings
    from inferfleet_operator.plan.planner import plan_service

    def build_name(namespace: str, settings: PlanSettings = DEFAULT_SETTINGS) -> str:
        svc = service(model={"name": "m", "uri": "hf://org/m"}, placement={"vendors": ["nvidia"]})
        svc["metadata"]["namespace"] = namespace
        [build] = plan_service(svc, [h100("h1")], RUNTIMES, {}, {}, NOW, settings).engine_builds
        assert build["metadata"]["namespace"] == namespace
        return build["metadata"]["name"]

    assert build_name("team-a") != build_name("team-b")
    shared = PlanSettings(share_engines_across_namespaces=True)
    assert build_name("team-a", shared) == build_name("team-b", shared)
