"""Runtime choice: policy × vendor × architecture × priority, with a reason for every choice and every exclusion."""

from __future__ import annotations

import pytest
from planning_data import RUNTIMES, cpu, h100, mi300x, node, runtime, service

from inferfleet_operator.api.types import parse_runtime, parse_service
from inferfleet_operator.plan.choice import Excluded, PoolChoice, choose_for_pool, choose_runtimes
from inferfleet_operator.plan.pools import group_pools

POOLS = {p.vendor: p for p in group_pools([h100("h1"), mi300x("m1"), cpu("c1")])}
PARSED = [parse_runtime(r) for r in RUNTIMES]


def choose(vendor: str, runtimes=PARSED, **spec):
    return choose_for_pool(parse_service(service(**spec)).spec, POOLS[vendor], runtimes)


@pytest.mark.parametrize(
    "policy, vendor, engine, runtime_name",
    [
        ("Auto", "nvidia", "Compiled", "compiled-tensorrt"),
        ("Auto", "amd", "Paged", "paged-rocm"),
        ("Auto", "cpu", "Paged", "paged-cpu"),
        ("Paged", "nvidia", "Paged", "paged-cuda"),
        ("Paged", "amd", "Paged", "paged-rocm"),
        ("Compiled", "nvidia", "Compiled", "compiled-tensorrt"),
    ],
)
def test_policy_and_vendor_pick_the_engine_and_runtime(policy, vendor, engine, runtime_name):
    result = choose(vendor, runtime={"policy": policy})
    assert isinstance(result, PoolChoice)
    assert (result.engine, result.runtime.name) == (engine, runtime_name)
    assert f"policy {policy}" in result.reason and result.runtime.name in result.reason


def test_compiled_pool_keeps_a_paged_companion_for_bridge_and_fallback():
    result = choose("nvidia")
    assert result.paged_runtime.name == "paged-cuda" and "paged companion paged-cuda" in result.reason


def test_policy_compiled_excludes_pools_no_compiled_runtime_fits():
    result = choose("amd", runtime={"policy": "Compiled"})
    assert isinstance(result, Excluded) and "no Compiled InferenceRuntime supports amd gfx942" in result.reason


def test_compiled_runtime_restricted_to_other_architectures_does_not_fit():
    (a100,) = group_pools(
        [
            node(
                "a",
                {
                    "nvidia.com/gpu.product": "NVIDIA-A100",
                    "nvidia.com/gpu.compute.major": "7",
                    "nvidia.com/gpu.compute.minor": "0",
                },
                {"nvidia.com/gpu": "8"},
            )
        ]
    )
    result = choose_for_pool(parse_service(service()).spec, a100, PARSED)
    assert result.engine == "Paged" and "no Compiled InferenceRuntime supports nvidia sm70" in result.reason


def test_unknown_architecture_never_gets_a_compiled_engine():
    (pool,) = group_pools([node("r", {}, {"nvidia.com/gpu": "4"})])
    any_arch = [parse_runtime(runtime("trt-any", "Compiled", ["nvidia"], priority=5)), parse_runtime(RUNTIMES[0])]
    result = choose_for_pool(parse_service(service()).spec, pool, any_arch)
    assert result.engine == "Paged" and "architecture is unknown" in result.reason


def test_higher_priority_wins_and_ties_break_by_name():
    rts = [
        parse_runtime(runtime(n, "Paged", ["amd"], priority=p)) for n, p in [("z-low", 1), ("b-high", 5), ("a-high", 5)]
    ]
    assert choose("amd", rts).runtime.name == "a-high"
    assert choose("amd", list(reversed(rts))).runtime.name == "a-high"


def test_vendor_not_in_placement_is_excluded_with_the_list():
    result = choose("amd", placement={"vendors": ["nvidia"]})
    assert (
        isinstance(result, Excluded) and result.reason == "VendorNotAllowed: amd is not in placement.vendors ['nvidia']"
    )


def test_pool_without_any_runtime_is_excluded():
    result = choose("cpu", [p for p in PARSED if p.name != "paged-cpu"])
    assert isinstance(result, Excluded) and result.reason.startswith("NoMatchingRuntime")


def test_pool_of_only_excluded_nodes_says_which_and_why():
    (pool,) = group_pools([h100("down", ready=False)])
    result = choose_for_pool(parse_service(service()).spec, pool, PARSED)
    assert isinstance(result, Excluded) and result.reason.startswith("NoEligibleNodes: down: NotReady")


def test_choose_runtimes_splits_chosen_and_excluded():
    chosen, excluded = choose_runtimes(
        parse_service(service(placement={"vendors": ["nvidia", "cpu"]})).spec, list(POOLS.values()), PARSED
    )
    assert sorted(c.pool.vendor for c in chosen) == ["cpu", "nvidia"] and [x.pool.vendor for x in excluded] == ["amd"]


def test_a_quantized_model_is_served_paged_where_a_compiled_runtime_fits_and_excluded_under_policy_compiled():
    model = {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "quantization": "Int4"}
    result = choose("nvidia", model=model)
    assert isinstance(result, PoolChoice) and (result.engine, result.runtime.name) == ("Paged", "paged-cuda")
    assert "model.quantization Int4 needs the paged engine (compiled engines serve float weights only)" in result.reason
    excluded = choose("nvidia", model=model, runtime={"policy": "Compiled"})
    assert isinstance(excluded, Excluded) and "policy Compiled but model.quantization Int4" in excluded.reason
