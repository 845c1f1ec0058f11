"""A local stand-in for the Hugging Face Hub: the HTTP API huggingface_hub's snapshot_download uses (test helper).

Serves one directory as model repo `repo_id` at one commit: model info (/api/models/{repo}/revision/{rev}),
the file tree (/api/models/{repo}/tree/{rev}), and files (/{repo}/resolve/{rev}/{file}) with ETag,
X-Repo-Commit, Content-Length and Range support. Every request is logged for the tests to inspect.
With `required_token` set the repo is gated, answered as the Hub does: 401 `GatedRepo` without an
Authorization header, 401 "Invalid credentials in Authorization header" with another token.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


@dataclass
class HubStandIn:
    repo_id: str
    root: Path
    revisions: tuple[str, ...] = ("main", COMMIT)
    drop_after_bytes: dict[str, int] = field(default_factory=dict)  # file -> cut the next GET after N bytes
    fail_gets: dict[str, int] = field(default_factory=dict)  # file -> answer this many GETs with HTTP 500
    requests: list[Request] = field(default_factory=list)
    required_token: str | None = None  # gated: every request needs `Authorization: Bearer <token>`
    # Files stored with Git LFS, as the hub stores weights: listed with their sha256 (blobId is the pointer's).
    lfs_suffixes: tuple[str, ...] = (".safetensors",)
    served_bytes: dict[str, bytes] = field(default_factory=dict)  # file -> what GETs answer instead of its bytes

    def start(self, host: str = "127.0.0.1", advertised: str = "") -> str:
        """Serves on `host` (another address than loopback: for pods of a kind cluster, which reach this machine at
        `advertised`); returns the endpoint URL."""
        self.server = ThreadingHTTPServer((host, 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return f"http://{advertised or host}:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}


def _handler(hub: HubStandIn):
    repo = re.escape(hub.repo_id)
    info_re = re.compile(rf"^/api/models/{repo}(?:/revision/(?P<rev>[^/]+))?$")
    tree_re = re.compile(rf"^/api/models/{repo}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
    file_re = re.compile(rf"^/{repo}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet; requests are recorded instead
            pass

        def do_HEAD(self):
            self._serve(send_body=False)

        def do_GET(self):
            self._serve(send_body=True)

        def _serve(self, send_body: bool):
            path = unquote(urlparse(self.path).path)
            hub.requests.append(Request(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
            if hub.required_token is not None and (refused := self._refusal()):
                return self._error(401, *refused)
            if m := info_re.match(path):
                if m["rev"] and m["rev"] not in hub.revisions:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {m['rev']}")
                siblings = [_sibling(hub, name, data) for name, data in hub.files().items()]
                return self._json(
                    {
                        "id": hub.repo_id,
                        "modelId": hub.repo_id,
                        "sha": COMMIT,
                        "private": False,
                        "siblings": siblings,
                        "tags": [],
                        "downloads": 0,
                        "likes": 0,
                    },
                    send_body,
                )
            if m := tree_re.match(path):
                if m["rev"] not in hub.revisions:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {m['rev']}")
                entries = [
                    {"type": "file", "path": name, "size": len(data), "oid": _blob_id(data)}
                    for name, data in hub.files().items()
                ]
                return self._json(entries, send_body)
            if m := file_re.match(path):
                data = hub.files().get(m["file"])
                if m["rev"] not in hub.revisions:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {m['rev']}")
                if data is None:
                    return self._error(404, "EntryNotFound", f"{m['file']} does not exist")
                if self.command == "GET" and hub.fail_gets.get(m["file"], 0) > 0:
                    hub.fail_gets[m["file"]] -= 1
                    return self._error(500, "InternalError", "storage backend unavailable")
                return self._file(m["file"], hub.served_bytes.get(m["file"], data), send_body)
            return self._error(404, "RepoNotFound", "Repository not found")

        def _refusal(self) -> tuple[str, str] | None:
            given = self.headers.get("Authorization")
            if given is None:
                return (
                    "GatedRepo",
                    f"Access to model {hub.repo_id} is restricted. You must be authenticated to access it.",
                )
            if given != f"Bearer {hub.required_token}":
                return "Unauthorized", "Invalid credentials in Authorization header"
            return None

        def _file(self, name: str, data: bytes, send_body: bool):
            start = 0
            if (r := self.headers.get("Range")) and (m := re.match(r"bytes=(\d+)-", r)):
                start = int(m[1])
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{_blob_id(data)}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not send_body:
                return
            cut = hub.drop_after_bytes.pop(name, None) if self.command == "GET" else None
            if cut is not None:  # simulate a broken connection mid-file
                self.wfile.write(data[start : start + cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(data[start:])

        def _json(self, body, send_body: bool):
            payload = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if send_body:
                self.wfile.write(payload)

        def _error(self, status: int, code: str, message: str):
            payload = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    return Handler


def _blob_id(data: bytes) -> str:
    """Git blob id, as the Hub reports for files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sibling(hub: HubStandIn, name: str, data: bytes) -> dict:
    """A file as the hub's model info lists it with files_metadata."""
    if not name.endswith(hub.lfs_suffixes):
        return {"rfilename": name, "size": len(data), "blobId": _blob_id(data)}
    sha256 = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
    lfs = {"size": len(data), "sha256": sha256, "pointerSize": len(pointer)}
    return {"rfilename": name, "size": len(data), "blobId": _blob_id(pointer), "lfs": lfs}
