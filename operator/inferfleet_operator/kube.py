"""The one module that talks to the Kubernetes API: server-side apply, status, deletes, Events."""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import decimal
import hashlib
import json
import os
import re
import ssl
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import httpx

FIELD_MANAGER = "inferfleet-operator"
REPORTING_CONTROLLER = "inferfleet.dev/operator"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"  # JSON is valid YAML, so the body is JSON
APPLIED_HASH_ANNOTATION = "inferfleet.dev/applied-hash"
WRITE_VERBS = frozenset({"apply", "apply-status", "create", "delete", "patch"})

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# kind -> (plural, namespaced) for every kind the operator reads or writes.
KINDS: dict[str, tuple[str, bool]] = {
    "Deployment": ("deployments", True),
    "Service": ("services", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "Job": ("jobs", True),
    "Node": ("nodes", False),
    "Event": ("events", True),
    "InferenceService": ("inferenceservices", True),
    "InferenceRuntime": ("inferenceruntimes", False),
    "EngineBuild": ("enginebuilds", True),
    "Pod": ("pods", True),
    "InferencePool": ("inferencepools", True),
}


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
class Credentials:
    """Where the API server is and how to prove who we are (token or client certificate)."""

    server: str
    ca_pem: bytes | None = None
    ca_path: str | None = None
    is_insecure: bool = False
    token: str | None = None
    token_path: str | None = None  # re-read when it changes: projected tokens rotate
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    cert_path: str | None = None
    key_path: str | None = None

    @classmethod
    def in_cluster(cls, environ: dict[str, str] | None = None) -> Credentials | None:
        environ = dict(os.environ if environ is None else environ)
        token_path = os.path.join(SERVICE_ACCOUNT_DIR, "token")
        host = environ.get("KUBERNETES_SERVICE_HOST")
        if not host or not os.path.exists(token_path):
            return None
        port = environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        ca_path = os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")
        return cls(server=f"https://{host}:{port}", token_path=token_path,
                   ca_path=ca_path if os.path.exists(ca_path) else None)

    @classmethod
    def from_connection_info(cls, info: Any) -> Credentials:
        """From a kopf.ConnectionInfo (kubeconfig login): base64 data fields are decoded here."""
        return cls(
            server=info.server.rstrip("/"),
            ca_pem=_decode_b64(info.ca_data),
            ca_path=_as_str(info.ca_path),
            is_insecure=bool(info.insecure),
            token=info.token,
            cert_pem=_decode_b64(info.certificate_data),
            key_pem=_decode_b64(info.private_key_data),
            cert_path=_as_str(info.certificate_path),
            key_path=_as_str(info.private_key_path),
        )

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(
            cafile=self.ca_path, cadata=self.ca_pem.decode() if self.ca_pem else None)
        if self.is_insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_path and self.key_path:
            context.load_cert_chain(self.cert_path, self.key_path)
        elif self.cert_pem and self.key_pem:
            # ssl reads client certificates only from files; they are read at once, then removed.
            with tempfile.TemporaryDirectory() as folder:
                cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
                for path, data in ((cert, self.cert_pem), (key, self.key_pem)):
                    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                        f.write(data)
                context.load_cert_chain(cert, key)
        return context


def _decode_b64(value: str | bytes | None) -> bytes | None:
    if not value:
        return None
    raw = value.encode() if isinstance(value, str) else value
    return raw if raw.lstrip().startswith(b"-----BEGIN") else base64.b64decode(raw)


def _as_str(path: Any) -> str | None:
    if path is None:
        return None
    return os.fsdecode(path)


class _BearerToken(httpx.Auth):
    """Bearer token auth that re-reads a token file after it changes (kubelet rotates it)."""

    def __init__(self, token: str | None, token_path: str | None):
        self._token = token
        self._token_path = token_path
        self._mtime: float | None = None

    def auth_flow(self, request: httpx.Request):
        if self._token_path:
            mtime = os.stat(self._token_path).st_mtime
            if mtime != self._mtime:
                with open(self._token_path, encoding="utf-8") as f:
                    self._token = f.read().strip()
                self._mtime = mtime
        if self._token:
            request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


def resource_path(api_version: str, kind: str, namespace: str | None = None,
                  name: str | None = None, subresource: str | None = None) -> str:
    plural, is_namespaced = KINDS[kind]
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

    def __init__(self, http: httpx.AsyncClient, *, instance: str = "inferfleet-operator",
                 on_request: Callable[[str, str], None] | None = None):
        self._http = http
        self._instance = instance
        self._on_request = on_request
        self.num_requests: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    def connect(cls, credentials: Credentials, *, instance: str = "inferfleet-operator",
                on_request: Callable[[str, str], None] | None = None,
                timeout: float = 30.0) -> Kube:
        http = httpx.AsyncClient(
            base_url=credentials.server, verify=credentials.ssl_context(),
            auth=_BearerToken(credentials.token, credentials.token_path),
            timeout=timeout, headers={"User-Agent": FIELD_MANAGER})
        return cls(http, instance=instance, on_request=on_request)

    @property
    def num_writes(self) -> int:
        return sum(n for (verb, _), n in self.num_requests.items() if verb in WRITE_VERBS)

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, verb: str, kind: str, method: str, path: str, *,
                       params: dict[str, str] | None = None, body: Any = None,
                       content_type: str = "application/json",
                       allow_missing: bool = False) -> dict | None:
        self.num_requests[(verb, kind)] += 1
        if self._on_request:
            self._on_request(verb, kind)
        content = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type} if content is not None else None
        response = await self._http.request(method, path, params=params, content=content,
                                            headers=headers)
        if response.status_code == 404 and allow_missing:
            return None
        if response.status_code >= 400:
            try:
                status = response.json()
                reason, message = status.get("reason", ""), status.get("message", response.text)
            except ValueError:
                reason, message = response.reason_phrase, response.text
            raise ApiError(response.status_code, reason, message)
        return response.json() if response.content else {}

    async def apply(self, obj: dict, *, force: bool = False) -> dict:
        """Server-side apply of a whole object under the operator's field manager."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": FIELD_MANAGER}
        if force:
            params["force"] = "true"
        result = await self._request("apply", obj["kind"], "PATCH", path, params=params, body=obj,
                                     content_type=APPLY_CONTENT_TYPE)
        assert result is not None
        return result

    async def apply_status(self, obj: dict, status: dict) -> dict:
        """Server-side apply of .status on the status subresource (the operator owns its status)."""
        meta = obj["metadata"]
        body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                "metadata": {"name": meta["name"], **({"namespace": meta["namespace"]}
                                                      if meta.get("namespace") else {})},
                "status": status}
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"],
                             "status")
        # Forced: status has one writer by design; a stale manager (for example a person who ran
        # `kubectl edit --subresource=status`) must not block the operator from reporting.
        result = await self._request("apply-status", obj["kind"], "PATCH", path,
                                     params={"fieldManager": FIELD_MANAGER, "force": "true"},
                                     body=body, content_type=APPLY_CONTENT_TYPE)
        assert result is not None
        return result

    async def patch_metadata(self, obj: dict, *, annotations: dict[str, str | None]) -> dict:
        """JSON merge patch of annotations (None removes one), for bookkeeping outside the applied
        manifest: an apply of a partial object would drop the manager's other fields."""
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        result = await self._request("patch", obj["kind"], "PATCH", path,
                                     params={"fieldManager": FIELD_MANAGER},
                                     body={"metadata": {"annotations": annotations}},
                                     content_type="application/merge-patch+json")
        assert result is not None
        return result

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str, *,
                     uid: str | None = None) -> bool:
        """Deletes one object (dependents in the background); False when it was already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1",
                                "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}  # never delete a same-named successor
        path = resource_path(api_version, kind, namespace, name)
        result = await self._request("delete", kind, "DELETE", path, body=body, allow_missing=True)
        return result is not None

    async def get(self, api_version: str, kind: str, namespace: str | None,
                  name: str) -> dict | None:
        path = resource_path(api_version, kind, namespace, name)
        return await self._request("get", kind, "GET", path, allow_missing=True)

    async def is_served(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` in `api_version` now (API discovery)."""
        result = await self._request("get", "Discovery", "GET", f"/apis/{api_version}", allow_missing=True)
        plural = KINDS[kind][0]
        return any(r.get("name") == plural for r in (result or {}).get("resources") or [])

    async def list(self, api_version: str, kind: str, namespace: str | None = None, *,
                   label_selector: str | None = None) -> list[dict]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self._request("list", kind, "GET",
                                     resource_path(api_version, kind, namespace), params=params)
        return list((result or {}).get("items") or [])

    async def post_event(self, regarding: dict, *, type: str, reason: str, note: str,
                         action: str, now: datetime.datetime | None = None) -> dict:
        """Posts a core v1 Event about `regarding` (an object as read from the API)."""
        meta = regarding["metadata"]
        namespace = meta.get("namespace") or "default"
        stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
            "involvedObject": {"apiVersion": regarding["apiVersion"], "kind": regarding["kind"],
                               "name": meta["name"], "namespace": meta.get("namespace"),
                               "uid": meta.get("uid")},
            "type": type, "reason": reason, "action": action,
            "message": note[:1000],  # Events are for people; long texts belong in status
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": REPORTING_CONTROLLER, "reportingInstance": self._instance,
        }
        result = await self._request("create", "Event", "POST",
                                     resource_path("v1", "Event", namespace), body=event)
        assert result is not None
        return result


# --- deciding whether an apply would change anything (so that a no-op resync writes nothing) ---

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]{0,2})$")
_SUFFIXES = {"": 1, "m": decimal.Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9,
             "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
             "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(value: Any) -> decimal.Decimal | None:
    """A Kubernetes quantity ("500m", "8Gi", 2) as a number; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return decimal.Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value)
    if not match:
        return None
    number, suffix = match.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return decimal.Decimal(number + suffix)
        if suffix not in _SUFFIXES:
            return None
        return decimal.Decimal(number) * _SUFFIXES[suffix]
    except decimal.InvalidOperation:
        return None


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
    meta["annotations"] = {**(meta.get("annotations") or {}),
                           APPLIED_HASH_ANNOTATION: applied_hash(desired)}
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


def owner_keys(obj: dict) -> Iterable[tuple[str, str]]:
    """(kind, name) of each owner named in an object's ownerReferences."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        yield ref.get("kind", ""), ref.get("name", "")
