"""The one module that talks to the Kubernetes API: server-side apply, status, deletes, Events.

Who it is comes from credentials.py (the official client's config loader); whether an apply would change
anything is decided by the pure functions in diff.py.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
from collections.abc import Callable
from typing import Any, Protocol

from inferfleet_operator.api.names import KINDS, MANAGER, REPORTING_CONTROLLER
from inferfleet_operator.kube.credentials import Credentials

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"  # JSON is valid YAML, so the body is JSON
WRITE_VERBS = frozenset({"apply", "apply-status", "create", "delete", "patch"})


class ApiError(Exception):
    """A request the API server refused, with its HTTP status and the server's message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def is_retryable(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    reason: str
    body: bytes


class Transport(Protocol):
    """How Kube's requests reach the API server: the aiohttp session below in the operator; the tests
    give an in-memory fake API server."""

    async def send(
        self, method: str, path: str, *, params: dict[str, str] | None, content: bytes | None, headers: dict | None
    ) -> Reply: ...

    async def close(self) -> None: ...


class AiohttpTransport:
    """aiohttp, the stack kopf's watches use, with the same credentials (Credentials.aiohttp_session). Not httpx:
    it costs about six times the CPU per request (1.8 ms against 0.3 ms for a 1.6 KB JSON reply over TLS, 8 in
    flight, on a 2-core machine), which at 200 nodes × 100 services was two fifths of the operator's busy
    time (e2e/bench/scale.py --profile-operator)."""

    # Requests in flight at once (more wait for a connection): a reconcile sends its writes side by side, and
    # at --concurrency 8 an unbounded pool opens a TLS connection per request in flight (peak RSS at 1,000
    # nodes × 500 services, one run each: 205.6 MB unbounded, 198.0 MB with 16).
    MAX_CONNECTIONS = 16

    def __init__(self, credentials: Credentials, timeout: float):
        self._server = credentials.server
        self._session = credentials.aiohttp_session(timeout=timeout, max_connections=self.MAX_CONNECTIONS)

    async def send(
        self, method: str, path: str, *, params: dict[str, str] | None, content: bytes | None, headers: dict | None
    ) -> Reply:
        headers = {"User-Agent": MANAGER, **(headers or {})}
        async with self._session.request(
            method, self._server + path, params=params, data=content, headers=headers
        ) as response:
            return Reply(response.status, response.reason or "", await response.read())

    async def close(self) -> None:
        await self._session.close()


def resource_path(
    api_version: str, kind: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None
) -> str:
    plural, is_namespaced = KINDS[kind].plural, KINDS[kind].is_namespaced
    parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
    if is_namespaced and namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Kube:
    """Async API client. Every request is counted by (verb, kind), so writes can be measured."""

    def __init__(
        self,
        transport: Transport,
        *,
        instance: str = MANAGER,
        on_request: Callable[[str, str], None] | None = None,
    ):
        self._transport = transport
        self._instance = instance
        self._on_request = on_request
        self.num_requests: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    def connect(
        cls,
        credentials: Credentials,
        *,
        instance: str = MANAGER,
        on_request: Callable[[str, str], None] | None = None,
        timeout: float = 30.0,
    ) -> Kube:
        return cls(AiohttpTransport(credentials, timeout), instance=instance, on_request=on_request)

    @property
    def num_writes(self) -> int:
        return sum(n for (verb, _), n in self.num_requests.items() if verb in WRITE_VERBS)

    async def close(self) -> None:
        await self._transport.close()

    async def _request(
        self,
        verb: str,
        kind: str,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        allow_missing: bool = False,
    ) -> dict | None:
        self.num_requests[(verb, kind)] += 1
        if self._on_request:
            self._on_request(verb, kind)
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        reply = await self._transport.send(method, path, params=params, content=content, headers=headers)
        if reply.status == 404 and allow_missing:
            return None
        if reply.status >= 400:
            text = reply.body.decode(errors="replace")
            try:
                status = json.loads(reply.body)
                reason, message = status.get("reason", ""), status.get("message", text)
            except ValueError:
                reason, message = reply.reason, text
            raise ApiError(reply.status, reason, message)
        return json.loads(reply.body) if reply.body else {}

    async def apply(self, obj: dict, *, force: bool = False) -> dict:
        """Server-side apply of a whole object under the operator's field manager."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": MANAGER}
        if force:
            params["force"] = "true"
        result = await self._request(
            "apply", obj["kind"], "PATCH", path, params=params, body=obj, content_type=APPLY_CONTENT_TYPE
        )
        assert result is not None
        return result

    async def apply_status(self, obj: dict, status: dict) -> dict:
        """Server-side apply of .status on the status subresource (the operator owns its status)."""
        meta = obj["metadata"]
        body = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": {"name": meta["name"], **({"namespace": meta["namespace"]} if meta.get("namespace") else {})},
            "status": status,
        }
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], "status")
        # Forced: status has one writer by design; a stale manager (for example a person who ran
        # `kubectl edit --subresource=status`) must not block the operator from reporting.
        result = await self._request(
            "apply-status",
            obj["kind"],
            "PATCH",
            path,
            params={"fieldManager": MANAGER, "force": "true"},
            body=body,
            content_type=APPLY_CONTENT_TYPE,
        )
        assert result is not None
        return result

    async def patch_metadata(self, obj: dict, *, annotations: dict[str, str | None]) -> dict:
        """JSON merge patch of annotations (None removes one), for bookkeeping outside the applied
        manifest: an apply of a partial object would drop the manager's other fields."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        result = await self._request(
            "patch",
            obj["kind"],
            "PATCH",
            path,
            params={"fieldManager": MANAGER},
            body={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
        )
        assert result is not None
        return result

    async def delete(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, uid: str | None = None
    ) -> bool:
        """Deletes one object (dependents in the background); False when it was already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}  # never delete a same-named successor
        path = resource_path(api_version, kind, namespace, name)
        result = await self._request("delete", kind, "DELETE", path, body=body, allow_missing=True)
        return result is not None

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict | None:
        path = resource_path(api_version, kind, namespace, name)
        return await self._request("get", kind, "GET", path, allow_missing=True)

    async def is_served(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` in `api_version` now (API discovery)."""
        result = await self._request("get", "Discovery", "GET", f"/apis/{api_version}", allow_missing=True)
        plural = KINDS[kind].plural
        return any(r.get("name") == plural for r in (result or {}).get("resources") or [])

    async def list(
        self, api_version: str, kind: str, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[dict]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self._request("list", kind, "GET", resource_path(api_version, kind, namespace), params=params)
        return list((result or {}).get("items") or [])

    async def post_event(
        self, regarding: dict, *, type: str, reason: str, note: str, action: str, now: datetime.datetime | None = None
    ) -> dict:
        """Posts a core v1 Event about `regarding` (an object as read from the API)."""
        meta = regarding["metadata"]
        namespace = meta.get("namespace") or "default"
        stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": regarding["apiVersion"],
                "kind": regarding["kind"],
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type,
            "reason": reason,
            "action": action,
            "message": note[:1000],  # Events are for people; long texts belong in status
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": MANAGER},
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": self._instance,
        }
        result = await self._request("create", "Event", "POST", resource_path("v1", "Event", namespace), body=event)
        assert result is not None
        return result
