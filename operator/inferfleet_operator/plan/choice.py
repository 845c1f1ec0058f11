"""choose_runtimes: per pool, policy × vendor × architecture × priority over the InferenceRuntime objects, with reasons."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inferfleet_operator.api.types import InferenceRuntime, InferenceServiceSpec
from inferfleet_operator.plan.nodes import UNKNOWN
from inferfleet_operator.plan.pools import Pool, common_resource


@dataclass(frozen=True)
class PoolChoice:
    pool: Pool
    engine: str  # "Compiled" | "Paged": what the pool should serve once everything is built
    runtime: InferenceRuntime
    paged_runtime: InferenceRuntime | None  # for bridging and fallback of a compiled pool (None: not possible)
    reason: str


@dataclass(frozen=True)
class Excluded:
    pool: Pool
    reason: str


def _ranked(runtimes: list[InferenceRuntime]) -> list[InferenceRuntime]:
    """Highest priority first; ties broken by name so the choice never depends on list order."""
    return sorted(runtimes, key=lambda r: (-r.spec.priority, r.name))


def _fits(runtime: InferenceRuntime, pool: Pool) -> bool:
    if pool.vendor not in runtime.spec.vendors:
        return False
    if runtime.spec.architectures:
        return pool.architecture in runtime.spec.architectures
    return True


def served_resource(runtime: InferenceRuntime, pool: Pool) -> str:
    """The extended resource the pool's pods request under `runtime` ("" on cpu pools)."""
    if pool.vendor == "cpu":
        return ""
    return runtime.spec.gpu_resource or pool.gpu_resource


def _has_resource(runtime: InferenceRuntime, pool: Pool) -> bool:
    """Some node of the pool advertises the resource the runtime's pods would request."""
    resource = served_resource(runtime, pool)
    return not resource or resource in pool.gpu_resources


def _on_resource(pool: Pool, resource: str) -> Pool:
    """The pool cut to the nodes advertising `resource`; the others move to excluded_nodes."""
    if not resource or pool.gpu_resources <= {resource}:
        return pool
    keep = [info for info in pool.nodes if info.gpu_resource == resource]
    dropped = tuple(
        (
            info.name,
            f"GPUResourceMissing: the node advertises {info.gpu_resource}, the chosen runtime requests {resource}",
        )
        for info in pool.nodes
        if info.gpu_resource != resource
    )
    return restrict_pool(pool, keep, dropped)


def restrict_pool(pool: Pool, keep: list, dropped: tuple[tuple[str, str], ...]) -> Pool:
    """The pool with only the eligible nodes `keep` (NodeInfo, non-empty); `dropped` (node, reason) are added to
    its excluded nodes."""
    return dataclasses.replace(
        pool,
        node_names=tuple(i.name for i in keep),
        node_gpus=tuple(i.gpu_count for i in keep),
        node_cpu_millis=tuple(i.cpu_millis for i in keep),
        gpus_per_node=min(i.gpu_count for i in keep),
        nodes=tuple(keep),
        excluded_nodes=tuple(sorted(pool.excluded_nodes + dropped)),
        gpu_resources=frozenset(i.gpu_resource for i in keep if i.gpu_resource),
        gpu_resource=common_resource(keep) if pool.vendor != "cpu" else pool.gpu_resource,
    )


def _where(pool: Pool) -> str:
    return f"{pool.vendor} {pool.architecture}"


def choose_for_pool(spec: InferenceServiceSpec, pool: Pool, runtimes: list[InferenceRuntime]) -> PoolChoice | Excluded:
    """One pool's runtime, or why the pool is left out."""
    if not pool.node_names:
        details = "; ".join(f"{node}: {reason}" for node, reason in pool.excluded_nodes) or "no nodes"
        return Excluded(pool, f"NoEligibleNodes: {details}")
    vendors = spec.placement.vendors
    if vendors and pool.vendor not in vendors:
        return Excluded(pool, f"VendorNotAllowed: {pool.vendor} is not in placement.vendors {list(vendors)}")
    by_vendor = [r for r in _ranked(runtimes) if _fits(r, pool)]
    fitting = [r for r in by_vendor if _has_resource(r, pool)]
    if by_vendor and not fitting:
        wanted = sorted({f"{r.name} requests {served_resource(r, pool)}" for r in by_vendor})
        advertised = sorted(pool.gpu_resources)
        return Excluded(
            pool,
            f"NoMatchingRuntime: no node of the pool advertises the GPU resource its runtimes request ({'; '.join(wanted)}; the nodes advertise {', '.join(advertised)})",
        )
    result = _choose_engine(spec, pool, fitting)
    if isinstance(result, Excluded):
        return result
    resource = served_resource(result.runtime, pool)
    paged, reason = result.paged_runtime, result.reason
    if paged is not None and paged.spec.gpu_resource not in ("", resource):
        # Bridge and fallback pods would ask for a resource other than the compiled pods': not on these nodes.
        # A runtime naming no resource requests what the (restricted) pool's nodes advertise, so it fits.
        paged = next((r for r in fitting if r.spec.engine == "Paged" and r.spec.gpu_resource in ("", resource)), None)
        companion = f"paged companion {paged.name}" if paged else "no Paged runtime for bridge or fallback"
        reason = reason.replace(f"paged companion {result.paged_runtime.name}", companion)
    return dataclasses.replace(result, pool=_on_resource(pool, resource), paged_runtime=paged, reason=reason)


def _choose_engine(spec: InferenceServiceSpec, pool: Pool, fitting: list[InferenceRuntime]) -> PoolChoice | Excluded:
    """Policy × the runtimes that fit the pool (ranked) -> the pool's engine and runtime."""
    paged = next((r for r in fitting if r.spec.engine == "Paged"), None)
    compiled_candidates = [r for r in fitting if r.spec.engine == "Compiled"]
    compiled = None
    compiled_note = f"no Compiled InferenceRuntime supports {_where(pool)}"
    if compiled_candidates and spec.model.runtime_quantization:
        compiled_note = (
            f"model.quantization {spec.model.quantization} needs the paged engine (compiled engines serve float "
            "weights only)"
        )
    elif compiled_candidates and spec.engine.tensor_parallel_size > 1:
        compiled_note = (
            f"engine.tensorParallelSize {spec.engine.tensor_parallel_size} needs the paged engine (compiled engines "
            "are exported for one device)"
        )
    elif compiled_candidates and pool.architecture == UNKNOWN:
        compiled_note = "the pool's GPU architecture is unknown and compiled engines are built per architecture"
    elif compiled_candidates:
        compiled = compiled_candidates[0]
    policy = spec.runtime.policy

    if policy == "Paged":
        if paged is None:
            return Excluded(
                pool, f"NoMatchingRuntime: policy Paged but no Paged InferenceRuntime supports {_where(pool)}"
            )
        return PoolChoice(
            pool,
            "Paged",
            paged,
            paged,
            f"policy Paged: runtime {paged.name} (priority {paged.spec.priority}) supports {_where(pool)}",
        )
    if compiled is not None:
        companion = f"; paged companion {paged.name}" if paged else "; no Paged runtime for bridge or fallback"
        return PoolChoice(
            pool,
            "Compiled",
            compiled,
            paged,
            f"policy {policy}: runtime {compiled.name} (priority {compiled.spec.priority}) compiles for {_where(pool)}{companion}",
        )
    if policy == "Compiled":
        return Excluded(pool, f"NoMatchingRuntime: policy Compiled but {compiled_note}")
    if paged is None:
        return Excluded(pool, f"NoMatchingRuntime: no InferenceRuntime supports {_where(pool)}")
    return PoolChoice(
        pool,
        "Paged",
        paged,
        paged,
        f"policy Auto: {compiled_note}; paged runtime {paged.name} (priority {paged.spec.priority})",
    )


def choose_runtimes(
    spec: InferenceServiceSpec, pools: list[Pool], runtimes: list[InferenceRuntime]
) -> tuple[list[PoolChoice], list[Excluded]]:
    """Every pool's choice, then the placement rule: accelerator pools first. A CPU pool serves only when
    placement.vendors lists cpu, when a pool override gives it replicas, or when no accelerator pool could be
    chosen."""
    chosen, excluded = [], []
    for pool in pools:
        result = choose_for_pool(spec, pool, runtimes)
        (chosen if isinstance(result, PoolChoice) else excluded).append(result)
    accelerated = [ch.pool.name for ch in chosen if ch.pool.vendor != "cpu"]
    if accelerated and "cpu" not in spec.placement.vendors:
        asked = {o.name for o in spec.pools if o.replicas > 0}
        why = (f"CPUNotRequested: accelerator pool(s) {', '.join(accelerated)} serve this service; CPU pools serve only "
               "when placement.vendors lists cpu, a pools[] override gives them replicas, or no accelerator pool is eligible")  # fmt: skip
        left_out = [ch for ch in chosen if ch.pool.vendor == "cpu" and ch.pool.name not in asked]
        excluded += [Excluded(ch.pool, why) for ch in left_out]
        chosen = [ch for ch in chosen if ch not in left_out]
    return chosen, excluded


def placement_tier(choice: PoolChoice) -> int:
    """Replicas fill tier 0 (accelerator pools) before tier 1 (CPU pools)."""
    return 1 if choice.pool.vendor == "cpu" else 0
