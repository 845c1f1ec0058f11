"""Which host folders file:// model URIs may mount: only those under a root an administrator allowed, compared on
normalised whole path components.

A hostPath volume reads any folder of the node (the kubelet's, other tenants' data), so a tenant may not choose one:
the roots are the operator's setting (--model-host-path-root, chart value modelHostPaths.allowedRoots), none by
default. A service whose file:// path is under none of them gets no pod and no build (HostPathNotAllowed); an
EngineBuild naming one gets no compile Job. Symlinks inside an allowed root are the node's, resolved by the kubelet:
an administrator allows only folders tenants cannot write to.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterable
from datetime import datetime

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api.types import uri_scheme
from inferfleet_operator.plan.findings import Finding

SETTING = "the chart value modelHostPaths.allowedRoots (operator flag --model-host-path-root)"


def normalise(path: str) -> str:
    """An absolute path with `.`, `..`, repeated and trailing slashes resolved lexically: what a prefix check may
    compare. `..` above the root stays at the root, as the kernel resolves it; "//x" is "/x" (posixpath keeps a
    leading "//")."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def _is_under(path: str, root: str) -> bool:
    """Whole components only: /srv/models-other is not under /srv/models."""
    return root == "/" or path == root or path.startswith(root + "/")


def allowed_host_path(path: str, roots: Iterable[str]) -> str | None:
    """The normalised form of `path` when it lies under one of `roots` (the path to mount), else None."""
    normal = normalise(path)
    return normal if any(_is_under(normal, normalise(root)) for root in roots) else None


def host_path_of(uri: str) -> str | None:
    """The host folder a file:// URI names (None for other schemes)."""
    return uri.split("://", 1)[1] if uri_scheme(uri) == "file" else None


def refusal(uri: str, roots: tuple[str, ...]) -> str | None:
    """Why `uri` may not be mounted (a message naming the setting that would allow it), or None."""
    path = host_path_of(uri)
    if path is None or allowed_host_path(path, roots) is not None:
        return None
    allowed = ", ".join(normalise(r) for r in roots) if roots else "none are allowed"
    return (
        f"host path {normalise(path)} is under no allowed root ({allowed}): a file:// model mounts a folder of the "
        f"node, which only an administrator may choose, with {SETTING}; use pvc://, hf:// or s3:// otherwise"
    )


def service_refusal(uri: str, roots: tuple[str, ...]) -> Finding | None:
    """The finding that keeps a service whose model URI may not be mounted from any pod or build."""
    why = refusal(uri, roots)
    return None if why is None else Finding(c.REASON_HOST_PATH_NOT_ALLOWED, f"spec.model.uri {uri}", why)


def refused_build(plan, why: str, previous: dict, now: datetime, generation: int):
    """A build plan (plan.builds.BuildPlan) with its compile Job withheld because its model's host path may not be
    mounted: Pending (an administrator may still allow the root), the Built condition saying why, one Warning when
    that reason is new."""
    conditions = c.by_type(previous.get("conditions"))
    built = c.condition(conditions, c.BUILT, c.FALSE, c.REASON_HOST_PATH_NOT_ALLOWED, why, now, generation)
    status = {k: v for k, v in plan.status.items() if k not in ("currentJob", "conditions")}
    # The attempt the Job would have been is not made: it is not counted.
    status.update(attempts=max(int(status.get("attempts") or 1) - 1, 0), state="Pending")
    status.update(progress="host path not allowed", message=why)
    status["conditions"] = [built]
    is_new = (conditions.get(c.BUILT) or {}).get("reason") != c.REASON_HOST_PATH_NOT_ALLOWED
    events = [c.warning(c.REASON_HOST_PATH_NOT_ALLOWED, why)] if is_new else []
    return dataclasses.replace(plan, job=None, status=status, requeue_after=None, events=events)
