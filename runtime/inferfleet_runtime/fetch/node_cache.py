"""A node's model cache: each model held once per node under the digest of its content, shared by every pod there.

Layout under the cache root (a folder on the node that the pods mount):

    entries/<digest>/          a model's files, named by content_digest(content_manifest(folder)); never edited
    sources/<key>.json         which entry a source (URI and revision) resolved to: a hint, never trusted alone
    locks/<key>.lock           held while one source is fetched: a second fetch of it on the node waits, then finds it
    locks/<digest>.use         held shared by each process using an entry (`UseLease`); its time is the entry's last
                               use (set by each `ensure`): eviction skips an entry leased or used within the grace
    staging/<random>/          a fetch in progress; renamed into entries/ only once its digest is computed
    fetches.jsonl              one line per fetch that downloaded bytes (uri, digest, bytes, seconds): what ran

An entry is trusted only by its content: `lookup` hashes every file again and compares with the folder's name, so a
tampered or half-written entry is never used (it is moved aside and fetched again; the caller is told why). Nothing
but a rename puts a folder under entries/, so a fetch cut off half way leaves only staging/ behind.

Capacity: a byte budget for the whole cache. After a fetch the least recently used entries that no process uses
are evicted until the cache fits (an entry `ensure` handed out within the grace period counts as in use: the
pod it was resolved for may not hold its lease yet); if it cannot fit (the model alone is larger, or what is in use fills it), the
fetch fails with a CacheFullError saying so and the new entry is dropped: nothing in use is ever evicted.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferfleet_runtime.fetch.common import FetchError
from inferfleet_runtime.fetch.content_digest import DIGEST_LENGTH, content_digest, content_manifest

FETCH_LOG = "fetches.jsonl"


class CacheFullError(FetchError):
    """The model does not fit the node cache's byte budget, even after evicting every entry no process uses."""


@dataclass(frozen=True)
class Entry:
    digest: str
    path: Path
    size: int
    last_used: float


@dataclass(frozen=True)
class Resolved:
    """What `ensure` found or made: the entry, whether this call downloaded it, and why an earlier entry was refused."""

    entry: Entry
    fetched: bool
    refused: str = ""  # e.g. "entries/ab12...: its content hashes to cd34..., not its name" (then fetched again)


def source_key(uri: str, revision: str | None) -> str:
    return hashlib.sha256(f"{uri}\0{revision or ''}".encode()).hexdigest()[:32]


def _is_digest(name: str) -> bool:
    return len(name) == DIGEST_LENGTH and all(c in "0123456789abcdef" for c in name)


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class NodeCache:
    def __init__(self, root: Path, budget_bytes: int | None = None, grace_seconds: float = 600.0):
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"the node cache's budget must be positive, not {budget_bytes} bytes")
        self.root = root
        self.budget = budget_bytes
        self.grace = grace_seconds
        for folder in ("entries", "sources", "locks", "staging"):
            (root / folder).mkdir(parents=True, exist_ok=True)

    # What is there.
    def entries(self) -> list[Entry]:
        out = []
        for path in sorted((self.root / "entries").iterdir()):
            if path.is_dir() and not path.is_symlink() and _is_digest(path.name):
                used = self._use_file(path.name)
                last = used.stat().st_mtime if used.exists() else path.stat().st_mtime
                out.append(Entry(path.name, path, _tree_size(path), last))
        return out

    def in_use(self, digest: str) -> bool:
        """Whether the entry was handed out within the grace period or some process holds its use lease (a shared
        lock, tried without waiting)."""
        path = self._use_file(digest)
        if not path.exists():
            return False
        if time.time() - path.stat().st_mtime < self.grace:
            return True
        with open(path, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
        return False

    def fetch_count(self, uri: str | None = None) -> int:
        """How many fetches downloaded bytes into this cache (of `uri`, when given), from fetches.jsonl."""
        log = self.root / FETCH_LOG
        if not log.exists():
            return 0
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        return sum(1 for line in lines if uri is None or line.get("uri") == uri)

    # Finding and filling.
    def lookup(self, uri: str, revision: str | None) -> tuple[Entry | None, str]:
        """The verified entry a source resolved to before, or (None, why not) when there is none to use. The entry
        is marked used (under the eviction lock) before its bytes are hashed, so no eviction takes it meanwhile."""
        with self._eviction_lock():
            digest, why = self._hinted(uri, revision)
            if digest is None:
                return None, why
            self._mark_used(digest)
        path = self.root / "entries" / digest
        try:
            actual = content_digest(content_manifest(path))
        except (OSError, ValueError) as exc:
            actual = f"nothing usable ({exc})"
        if actual != digest:
            self._discard(path)
            return None, f"entries/{digest}: its content hashes to {actual}, not its name; fetched again"
        return Entry(digest, path, _tree_size(path), time.time()), ""

    def _hinted(self, uri: str, revision: str | None) -> tuple[str | None, str]:
        hint = self.root / "sources" / f"{source_key(uri, revision)}.json"
        try:
            digest = json.loads(hint.read_text())["digest"]
        except (OSError, ValueError, KeyError, TypeError):
            return None, ""
        if not isinstance(digest, str) or not _is_digest(digest):
            return None, f"sources/{hint.name}: names no entry"
        path = self.root / "entries" / digest
        if not path.is_dir() or path.is_symlink():
            return None, ""
        return digest, ""

    def ensure(
        self, uri: str, revision: str | None, download: Callable[[Path], None], wait_log: Callable[[str], None] = print
    ) -> Resolved:
        """The source's entry, downloaded by `download(folder)` only when no verified entry exists. One fetch per
        source at a time on this node: a concurrent call waits for the first one's lock, then finds its entry."""
        key = source_key(uri, revision)
        with open(self.root / "locks" / f"{key}.lock", "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                wait_log(f"another fetch of {uri} is running on this node: waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
            entry, refused = self.lookup(uri, revision)
            if entry is not None:
                return Resolved(entry, fetched=False, refused=refused)
            entry = self._fetch_into_cache(uri, download)
            hint = self.root / "sources" / f"{key}.json"
            _write_atomically(hint, json.dumps({"digest": entry.digest, "revision": revision, "uri": uri}) + "\n")
            return Resolved(entry, fetched=True, refused=refused)

    def _eviction_lock(self):
        return _Flock(self.root / "locks" / "evict.lock")

    def _mark_used(self, digest: str) -> None:
        path = self._use_file(digest)
        path.touch()
        os.utime(path)

    def _fetch_into_cache(self, uri: str, download: Callable[[Path], None]) -> Entry:
        staging = self.root / "staging" / uuid.uuid4().hex
        began = time.monotonic()
        try:
            download(staging)
            try:
                digest = content_digest(content_manifest(staging))
            except ValueError as exc:
                raise FetchError(f"{uri}: {exc}") from exc
            size = _tree_size(staging)
            final = self.root / "entries" / digest
            with self._eviction_lock():
                self.make_room(size, keep=digest)
                if final.is_dir():  # the same bytes came from another source earlier: keep that entry
                    shutil.rmtree(staging)
                else:
                    os.rename(staging, final)
                self._mark_used(digest)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        seconds = round(time.monotonic() - began, 3)
        line = {"uri": uri, "digest": digest, "bytes": size, "seconds": seconds, "time": time.time()}
        with open(self.root / FETCH_LOG, "a") as log:
            log.write(json.dumps(line, sort_keys=True) + "\n")
        return Entry(digest, final, size, time.time())

    # Capacity.
    def make_room(self, size: int, keep: str = "") -> list[str]:
        """Evicts the least recently used entries no process uses until `size` more bytes fit the budget; returns
        the digests evicted. CacheFullError (nothing evicted) when even evicting all of them would not do. Callers
        hold the eviction lock."""
        if self.budget is None:
            return []
        entries = [e for e in self.entries() if e.digest != keep]
        held = sum(e.size for e in entries)
        if held + size <= self.budget:
            return []
        free = sorted((e for e in entries if not self.in_use(e.digest)), key=lambda e: e.last_used)
        in_use = held - sum(e.size for e in free)
        if in_use + size > self.budget:
            raise CacheFullError(
                f"the model is {size} bytes and the node cache's budget is {self.budget} bytes, of which entries in "
                f"use hold {in_use}: it cannot fit without evicting a model in use"
            )
        evicted = []
        for entry in free:
            if held + size <= self.budget:
                break
            self._discard(entry.path)
            held -= entry.size
            evicted.append(entry.digest)
        return evicted

    def _discard(self, path: Path) -> None:
        """Moves a folder out of entries/ at once (a rename), then deletes it: no reader finds it half deleted."""
        gone = self.root / "staging" / f"discard-{uuid.uuid4().hex}"
        os.rename(path, gone)
        shutil.rmtree(gone, ignore_errors=True)

    # Use.
    def _use_file(self, digest: str) -> Path:
        return self.root / "locks" / f"{digest}.use"

    def lease(self, digest: str) -> UseLease:
        return UseLease(self._use_file(digest))


def lease_for(model: Path) -> UseLease | None:
    """The use lease of the node-cache entry that `model` (a link `fetch --node-cache` made, or the entry) resolves
    to; None for a model elsewhere."""
    resolved = model.resolve()
    use = resolved.parent.parent / "locks" / f"{resolved.name}.use"
    if resolved.parent.name != "entries" or not _is_digest(resolved.name) or not use.is_file():
        return None
    return UseLease(use)


class UseLease:
    """A shared lock on an entry for as long as the holder uses it (a serving process, for its life): eviction skips
    an entry while any lease on it is held. Taken on a read-only mount too (the file is opened for reading; `ensure`
    made it)."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None

    def __enter__(self) -> UseLease:
        self._file = open(self.path, "rb")
        fcntl.flock(self._file, fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Flock:
    """An exclusive lock on a file for a with-block (made when missing)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        self._file = open(self.path, "a+b")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        self._file.close()


def _write_atomically(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    part.write_text(text)
    os.replace(part, path)
