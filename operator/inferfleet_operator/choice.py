"""choose_runtimes: per pool, policy × vendor × architecture × priority over the InferenceRuntime objects, with reasons."""

from __future__ import annotations

from dataclasses import dataclass

from .api import InferenceRuntime, InferenceServiceSpec
from .nodes import UNKNOWN
from .pools import Pool


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
    fitting = [r for r in _ranked(runtimes) if _fits(r, pool)]
    paged = next((r for r in fitting if r.spec.engine == "Paged"), None)
    compiled_candidates = [r for r in fitting if r.spec.engine == "Compiled"]
    compiled = None
    compiled_note = f"no Compiled InferenceRuntime supports {_where(pool)}"
    if compiled_candidates and pool.architecture == UNKNOWN:
        compiled_note = "the pool's GPU architecture is unknown and compiled engines are built per architecture"
    elif compiled_candidates:
        compiled = compiled_candidates[0]
    policy = spec.runtime.policy

    if policy == "Paged":
        if paged is None:
            return Excluded(pool, f"NoMatchingRuntime: policy Paged but no Paged InferenceRuntime supports {_where(pool)}")
        return PoolChoice(pool, "Paged", paged, paged, f"policy Paged: runtime {paged.name} (priority {paged.spec.priority}) supports {_where(pool)}")
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
    return PoolChoice(pool, "Paged", paged, paged, f"policy Auto: {compiled_note}; paged runtime {paged.name} (priority {paged.spec.priority})")


def choose_runtimes(spec: InferenceServiceSpec, pools: list[Pool], runtimes: list[InferenceRuntime]) -> tuple[list[PoolChoice], list[Excluded]]:
    chosen, excluded = [], []
    for pool in pools:
        result = choose_for_pool(spec, pool, runtimes)
        (chosen if isinstance(result, PoolChoice) else excluded).append(result)
    return chosen, excluded
