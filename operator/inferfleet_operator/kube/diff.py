"""Pure decisions about applied manifests: would an apply change anything, digests, object trimming."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from inferfleet_operator.api.names import APPLIED_HASH_ANNOTATION
from inferfleet_operator.api.quantity import parse_quantity

# --- deciding whether an apply would change anything (so that a no-op resync writes nothing) ---


def is_subset(desired: Any, live: Any) -> bool:
    """Whether every field of `desired` is already in `live` with the same value.

    The API server adds defaults, drops empty values and writes quantities in canonical form
    ("1000m" -> "1"), so those differences do not count. Lists compare element by element.
    """
    if desired is None or desired == {}:
        return True  # applying an empty map or null changes nothing that is set
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list):
            return not desired and live is None
        return len(desired) == len(live) and all(is_subset(d, v) for d, v in zip(desired, live))
    if desired == live:
        return True
    if isinstance(desired, (str, int, float)) and isinstance(live, (str, int, float)):
        left, right = parse_quantity(desired), parse_quantity(live)
        return left is not None and left == right
    return False


def applied_hash(desired: dict) -> str:
    """A digest of a desired manifest, recorded on the object when it is applied."""
    body = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def with_applied_hash(desired: dict) -> dict:
    """The manifest to apply: `desired` plus the digest annotation that `needs_apply` reads."""
    meta = dict(desired["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH_ANNOTATION: applied_hash(desired)}
    return {**desired, "metadata": meta}


def needs_apply(desired: dict, live: dict | None) -> bool:
    """Whether server-side applying `desired` would change the live object.

    Two checks: the digest annotation changes when the operator's own manifest changes (this also
    catches fields the operator stopped setting, which an apply removes), and the subset check
    catches drift: a field the operator owns that was edited or removed by someone else.
    """
    if live is None:
        return True
    annotations = live.get("metadata", {}).get("annotations") or {}
    if annotations.get(APPLIED_HASH_ANNOTATION) != applied_hash(desired):
        return True
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "status")}
    return not is_subset(body, live)


def strip_object(obj: dict, keep_status: bool = True) -> dict:
    """A copy without managedFields (large, and never needed by the planner)."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    out = {k: v for k, v in obj.items() if k != "metadata" and (keep_status or k != "status")}
    out["metadata"] = meta
    return out
