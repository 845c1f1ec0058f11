"""What becomes of a finished EngineBuild: rebuilt when its serving pods find its engine lost, deleted (with its
engine directory, by the reconcile) once no service references it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from inferfleet_operator.api.conditions import format_time, parse_time
from inferfleet_operator.api.names import REBUILD_ANNOTATION, UNREFERENCED_ANNOTATION
from inferfleet_operator.api.types import DEFAULT_SETTINGS, PlanSettings


def attempt_of(job_name: str) -> int:
    """The attempt number at the end of a Job name (<build>-<n>); 0 when there is none."""
    tail = job_name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() and "-" in job_name else 0


def rebuild_request(build: dict) -> str | None:
    """The value of REBUILD_ANNOTATION that asks a Ready build to rebuild the engine its serving pods found lost
    (its current Job's name), or None when the build is not Ready or that rebuild was asked already."""
    status = build.get("status") or {}
    current = status.get("currentJob") or ""
    if status.get("state") != "Ready" or not attempt_of(current):
        return None
    asked = ((build.get("metadata") or {}).get("annotations") or {}).get(REBUILD_ANNOTATION)
    return None if asked == current else current


def rebuilds_for_lost_engines(
    pools: list[dict], lost: list[tuple[str, str, str]], builds: dict[str, dict]
) -> dict[str, tuple[str, str]]:
    """Build key -> (REBUILD_ANNOTATION value, the pod that found it lost), for each Ready build a pool serves
    whose serving pods exit with ENGINE_LOST_EXIT_CODE. A pod created before the build's current Job finished
    says nothing about that Job's engine (it may be a leftover of the lost one), so it does not count."""
    out = {}
    for entry in pools:
        key = entry.get("servingEngineBuild") or ""
        build = builds.get(key)
        if not key or build is None or entry.get("servingEngine") != "Compiled":
            continue
        value = rebuild_request(build)
        finished = parse_time((build.get("status") or {}).get("completionTime"))
        for pool, pod, created in lost:
            created_at = parse_time(created)
            if pool == entry.get("name") and value and not (finished and created_at and created_at < finished):
                out[key] = (value, pod)
                break
    return out


# ------------------------------------------------------------------ garbage collection


@dataclass(frozen=True)
class GcDecision:
    """delete: the build is unreferenced for longer than the retention; requeue_after: when to look again;
    unreferenced_since: RFC 3339 time to record (annotation inferfleet.dev/unreferenced-since), or None when
    the build is referenced (remove the annotation if present)."""

    delete: bool
    requeue_after: float | None
    unreferenced_since: str | None


def referencing_services(build: dict, services: list[dict]) -> list[str]:
    """Names of the services (of the build's namespace) whose status lists the build as built-for or serving."""
    meta = build.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    found = []
    for svc in services:
        svc_meta = svc.get("metadata") or {}
        if svc_meta.get("namespace") != namespace:
            continue
        pools = (svc.get("status") or {}).get("pools") or []
        if any(name in (p.get("engineBuild"), p.get("servingEngineBuild")) for p in pools):
            found.append(svc_meta.get("name", ""))
    return sorted(found)


def plan_gc(build: dict, services: list[dict], now: datetime, settings: PlanSettings = DEFAULT_SETTINGS) -> GcDecision:
    """Decide whether an EngineBuild is garbage: referenced means some InferenceService of its namespace lists
    it in status.pools[].engineBuild or status.pools[].servingEngineBuild."""
    if referencing_services(build, services):
        return GcDecision(False, None, None)
    annotations = (build.get("metadata") or {}).get("annotations") or {}
    since = parse_time(annotations.get(UNREFERENCED_ANNOTATION)) or now
    expires = since + timedelta(seconds=settings.build_retention_seconds)
    if now >= expires:
        return GcDecision(True, None, format_time(since))
    return GcDecision(False, (expires - now).total_seconds(), format_time(since))
