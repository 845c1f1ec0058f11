"""The InferenceService .status from the planned pools: conditions, summary columns, and Events for what changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api.types import InferenceService
from inferfleet_operator.plan import findings
from inferfleet_operator.plan.choice import Excluded
from inferfleet_operator.plan.network import exposed

TRANSITIONAL = (c.REASON_BRIDGING, c.REASON_SERVING_PREVIOUS_ENGINE, c.REASON_WAITING_FOR_BUILD)
FAILED = (c.REASON_FALLBACK_PAGED, c.REASON_BUILD_FAILED_NO_FALLBACK)


def _names(entries: list[dict]) -> str:
    return ", ".join(e["name"] for e in entries)


def _engines_built(entries: list[dict]) -> tuple[str, str, str]:
    compiled = [e for e in entries if e.get("engineBuild")]
    if not compiled:
        return c.TRUE, c.REASON_NO_ENGINES_NEEDED, "no pool serves a compiled engine"
    failed = [e for e in compiled if e["buildState"] == "Failed"]
    if failed:
        return c.FALSE, c.REASON_BUILD_FAILED, f"engine build failed for pool(s) {_names(failed)}"
    pending = [e for e in compiled if e["buildState"] != "Ready"]
    if pending:
        return c.FALSE, c.REASON_ENGINES_BUILDING, f"engine build(s) not ready for pool(s) {_names(pending)}"
    return c.TRUE, c.REASON_ENGINES_READY, f"{len(compiled)} pool(s) have their compiled engine"


def _rolled_out(entries: list[dict]) -> tuple[str, str, str]:
    moving = [e for e in entries if e.get("reason") in TRANSITIONAL]
    if moving:
        return c.FALSE, c.REASON_ROLLING_OUT, f"pool(s) {_names(moving)} not yet on their planned engine"
    behind = [e for e in entries if e["servingEngine"] != "None" and e["readyReplicas"] != e["desiredReplicas"]]
    if behind:
        return c.FALSE, c.REASON_ROLLING_OUT, f"pool(s) {_names(behind)} have ready replicas != desired"
    return c.TRUE, c.REASON_ROLLED_OUT, f"{len(entries)} pool(s) as planned"


def _ready(entries: list[dict], excluded: list[Excluded]) -> tuple[str, str, str]:
    if not entries:
        why = "; ".join(f"{x.pool.name}: {x.reason}" for x in excluded) or "the cluster has no nodes"
        return c.FALSE, c.REASON_NO_ELIGIBLE_POOLS, f"no pool can serve: {why}"
    ready = sum(e["readyReplicas"] for e in entries)
    if ready == 0:
        return c.FALSE, c.REASON_NO_READY_REPLICAS, "no serving replica is ready"
    short = [e for e in entries if e["readyReplicas"] < e["desiredReplicas"]]
    if short:
        return c.TRUE, c.REASON_SOME_POOLS_READY, f"{ready} replica(s) ready; pool(s) {_names(short)} short"
    return c.TRUE, c.REASON_ALL_POOLS_READY, f"{ready} replica(s) ready"


def _degraded(entries: list[dict], num_unplaced: int) -> tuple[str, str, str]:
    failed = [e for e in entries if e.get("reason") in FAILED or e.get("buildState") == "Failed"]
    if failed:
        serving = [e for e in failed if e["servingEngine"] != "None"]
        detail = f"; {_names(serving)} still serving" if serving else "; nothing serves there"
        reason = c.REASON_BUILD_FAILED if serving else c.REASON_BUILD_FAILED_NO_FALLBACK
        return c.TRUE, reason, f"engine build failed for pool(s) {_names(failed)}{detail}"
    if num_unplaced:
        return c.TRUE, c.REASON_INSUFFICIENT_CAPACITY, f"{num_unplaced} replica(s) fit no pool"
    return c.FALSE, c.REASON_AS_PLANNED, "every pool serves as planned"


def build_status(
    service: InferenceService,
    entries: list[dict],
    excluded: list[Excluded],
    num_unplaced: int,
    endpoint: str,
    now: datetime,
    refused: findings.Finding | None = None,
) -> dict:
    """refused: why the service may not run at all (its model's host path): Ready is False with its reason, and the
    finding, folded in by StatusReport, makes Degraded True."""
    previous = c.by_type(service.status.get("conditions"))
    generation = service.meta.generation
    computed = {
        c.READY: (c.FALSE, refused.reason, refused.text) if refused else _ready(entries, excluded),
        c.ENGINES_BUILT: _engines_built(entries),
        c.ROLLED_OUT: _rolled_out(entries),
        c.DEGRADED: _degraded(entries, num_unplaced),
        c.EXPOSED: exposed(service),
    }
    conditions = [c.condition(previous, t, *computed[t], now, generation) for t in c.SERVICE_CONDITIONS]
    serving = sorted(e["servingEngine"] for e in entries if e["servingEngine"] != "None")
    runtimes = ",".join(f"{engine}={serving.count(engine)}" for engine in sorted(set(serving))) or "None"
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "endpoint": endpoint,
        "poolCount": len(entries),
        "runtimes": runtimes,
        "replicas": sum(e["desiredReplicas"] for e in entries),
        "readyReplicas": sum(e["readyReplicas"] for e in entries),
        "unplacedReplicas": num_unplaced,
        "pools": entries,
        "excludedPools": [
            {"name": x.pool.name, "vendor": x.pool.vendor, "product": x.pool.product, "reason": x.reason}
            for x in excluded
        ],
    }


def pool_events(previous: dict, status: dict) -> list[c.PlannedEvent]:
    """Events for pools whose serving changed and for conditions that flipped, against the previous status.

    One Event per reason, not per pool: pools that changed to the same reason share one Event naming each
    of them; pools given no replicas and newly excluded pools are named in the first Normal one (an Event of
    their own when no pool changed the good way), and conditions that flipped the good way share one Normal
    Event (a bad flip keeps its own Warning). A first rollout whose serving pools share one reason posts one
    Event, its readiness one more, and a resync with nothing changed none: each Event is a write the API
    server stores, and a fleet of services rolling out at once makes thousands of them."""
    events = []
    before = {p.get("name"): p for p in previous.get("pools") or []}
    changed: dict[str, list[str]] = {}
    for entry in status["pools"]:
        old = before.get(entry["name"], {})
        if (old.get("reason"), old.get("servingEngine"), old.get("engineBuild")) == (
            entry.get("reason"), entry["servingEngine"], entry.get("engineBuild"),
        ):  # fmt: skip
            continue
        text = f"{entry['name']}: serving {entry['servingEngine']} ({entry['choiceReason']})"
        if entry.get("engineBuild"):
            text += f"; engine build {entry['engineBuild']} is {entry['buildState']}"
        changed.setdefault(entry["reason"], []).append(text)

    def line(reason: str, texts: list[str]) -> str:
        return f"{'Pool' if len(texts) == 1 else 'Pools'} {reason}: {'; '.join(texts)}"

    for reason, texts in changed.items():
        if reason != c.REASON_NO_REPLICAS:
            events.append((c.warning if reason in FAILED else c.normal)(reason, line(reason, texts)))
    if c.REASON_NO_REPLICAS in changed:
        _name_in_first_normal(events, c.REASON_NO_REPLICAS, line(c.REASON_NO_REPLICAS, changed[c.REASON_NO_REPLICAS]))
    old_excluded = {x.get("name"): x.get("reason") for x in previous.get("excludedPools") or []}
    excluded = [
        f"{x['name']} ({x['reason']})" for x in status["excludedPools"] if old_excluded.get(x["name"]) != x["reason"]
    ]
    if excluded:
        _name_in_first_normal(events, "PoolExcluded", line("excluded", excluded))
    old_conditions = c.by_type(previous.get("conditions"))
    good = []
    for cond in status["conditions"]:
        is_warning = (cond["type"] in c.WARN_WHEN_TRUE) == (cond["status"] == c.TRUE)
        # A first status speaks only of a service open to the cluster; other conditions speak when they flip.
        is_first_exposure = not old_conditions and cond["type"] == c.EXPOSED and cond["status"] == c.TRUE
        if (old_conditions and c.flipped(old_conditions, cond)) or is_first_exposure:
            text = f"{cond['type']} is {cond['status']}: {cond['message']}"
            if is_warning:
                events.append(c.warning(cond["reason"], text))
            else:
                good.append((cond["reason"], text))
    if good:  # named by the first (Ready's, when it flipped): the conditions' order is fixed
        events.append(c.normal(good[0][0], "; ".join(text for _, text in good)))
    return events


def _name_in_first_normal(events: list[c.PlannedEvent], reason: str, text: str) -> None:
    """Appends text to the first Normal Event, or adds a Normal Event of its own (reason) when there is none."""
    first = next((i for i, e in enumerate(events) if e.type == "Normal"), None)
    if first is None:
        events.append(c.normal(reason, text))
    else:
        events[first] = c.normal(events[first].reason, f"{events[first].message}. {text}")


@dataclass(frozen=True)
class StatusReport:
    """The planned status and Events, and the findings to fold into them. The status written is
    `with_refusals(refused)`'s: the refused writes are known once the applies have run, the rest at planning.

    planned: the status as planned (conditions, pools, autoscaling, routing), before any finding.
    pool_events: pool_events(previous, planned); other_events: the plan's other Events (autoscaling).
    found: the findings other than refused writes (pods, builds, claims, children not owned).
    previous: the status as read; generation: metadata.generation as read.
    """

    planned: dict
    pool_events: tuple[c.PlannedEvent, ...]
    other_events: tuple[c.PlannedEvent, ...]
    found: tuple[findings.Finding, ...]
    previous: dict
    now: datetime
    generation: int

    def with_refusals(self, refused: Mapping[tuple[str, str, str], str]) -> tuple[dict, list[c.PlannedEvent]]:
        """refused: (kind, name, pool) -> the API server's message, for each write it refused."""
        found = [
            findings.apply_finding(kind, name, message, pool) for (kind, name, pool), message in sorted(refused.items())
        ]
        found += self.found
        if not found:
            return self.planned, [*self.pool_events, *self.other_events]
        status = findings.degraded_status(
            self.planned, found, c.by_type(self.previous.get("conditions")), self.now, self.generation
        )
        # The pools' Events, against the status with the findings; the Degraded flip is said by the
        # findings' own Warnings (one per reason).
        events = [
            e for e in pool_events(self.previous, status) if not (e.type == "Warning" and e.reason in findings.ORDER)
        ]
        events += self.other_events
        events += [c.warning(reason, message) for reason, message in findings.grouped(found)]
        return status, events
