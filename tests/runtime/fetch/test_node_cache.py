"""The node's model cache (fetch/node_cache.py) and `fetch --node-cache`: one fetch per node and source, entries
trusted only by their content digest, never half written, evicted least recently used within a byte budget and never
while in use."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from inferfleet_runtime.fetch import sources as fetch
from inferfleet_runtime.fetch.common import FetchError
from inferfleet_runtime.fetch.content_digest import content_digest, content_manifest
from inferfleet_runtime.fetch.node_cache import CacheFullError, NodeCache, lease_for


def make_model(folder: Path, text: str, size: int = 1000) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"name": text}))
    (folder / "model.safetensors").write_bytes(text.encode() * (size // len(text)))
    return f"file://{folder}"


def run_fetch(uri: str, to: Path, cache: Path, budget: int | None = None) -> int:
    args = argparse.Namespace(
        uri=uri, to=to, no_progress=True, revision=None, node_cache=cache, node_cache_budget=budget
    )
    return fetch.run(args)


def test_a_second_fetch_on_the_node_finds_the_entry_and_fetches_nothing(tmp_path, capsys):
    uri = make_model(tmp_path / "src", "alpha")
    cache = tmp_path / "cache"
    assert run_fetch(uri, tmp_path / "pod1" / "model", cache) == 0
    assert run_fetch(uri, tmp_path / "pod2" / "model", cache) == 0
    assert NodeCache(cache).fetch_count(uri) == 1
    entries = NodeCache(cache).entries()
    assert len(entries) == 1
    # The entry is named by its content, and each pod's --to links to it.
    assert entries[0].digest == content_digest(content_manifest(tmp_path / "src"))
    for pod in ("pod1", "pod2"):
        link = tmp_path / pod / "model"
        assert link.is_symlink() and link.resolve() == entries[0].path.resolve()
        assert (link / "model.safetensors").read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()
    err = capsys.readouterr().err
    assert "fetched into the node cache" in err and "found in the node cache" in err


def _slow_ensure(cache: str, uri: str, started, results) -> None:
    def download(folder: Path) -> None:
        started.set()
        time.sleep(0.5)  # long enough that the other process arrives while this one holds the source's lock
        fetch.fetch(uri, folder, show_progress=False)

    results.put(NodeCache(Path(cache)).ensure(uri, None, download, wait_log=lambda _: None).entry.digest)


def test_concurrent_fetches_of_one_source_on_a_node_download_once(tmp_path):
    uri = make_model(tmp_path / "src", "beta")
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    started, results = ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_slow_ensure, args=(str(cache), uri, started, results))
    first.start()
    assert started.wait(10)
    second = ctx.Process(target=_slow_ensure, args=(str(cache), uri, ctx.Event(), results))
    second.start()
    digests = {results.get(timeout=30), results.get(timeout=30)}
    first.join(10)
    second.join(10)
    assert len(digests) == 1
    assert NodeCache(cache).fetch_count(uri) == 1


def test_a_tampered_entry_is_refused_and_fetched_again(tmp_path, capsys):
    uri = make_model(tmp_path / "src", "gamma")
    cache = tmp_path / "cache"
    assert run_fetch(uri, tmp_path / "pod1" / "model", cache) == 0
    (entry,) = NodeCache(cache).entries()
    with open(entry.path / "model.safetensors", "r+b") as f:  # one byte changed, same size
        f.write(b"X")
    assert run_fetch(uri, tmp_path / "pod2" / "model", cache) == 0
    assert NodeCache(cache).fetch_count(uri) == 2
    assert "Refused a node-cache entry" in capsys.readouterr().err
    (again,) = NodeCache(cache).entries()
    assert again.digest == entry.digest
    assert (again.path / "model.safetensors").read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()


def test_a_hint_naming_anything_but_an_entry_is_ignored(tmp_path):
    uri = make_model(tmp_path / "src", "delta")
    cache = NodeCache(tmp_path / "cache")
    from inferfleet_runtime.fetch.node_cache import source_key

    hint = cache.root / "sources" / f"{source_key(uri, None)}.json"
    hint.write_text(json.dumps({"digest": "../../../etc"}))
    entry, why = cache.lookup(uri, None)
    assert entry is None and "names no entry" in why
    resolved = cache.ensure(uri, None, lambda folder: fetch.fetch(uri, folder, show_progress=False))
    assert resolved.fetched and resolved.entry.path.parent == cache.root / "entries"


def test_a_fetch_cut_off_half_way_leaves_no_entry(tmp_path):
    uri = make_model(tmp_path / "src", "epsilon")
    cache = NodeCache(tmp_path / "cache")

    def breaks(folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        raise FetchError("connection reset")

    with pytest.raises(FetchError, match="connection reset"):
        cache.ensure(uri, None, breaks)
    assert cache.entries() == [] and list((cache.root / "staging").iterdir()) == []
    resolved = cache.ensure(uri, None, lambda folder: fetch.fetch(uri, folder, show_progress=False))
    assert resolved.fetched and cache.fetch_count() == 1


def test_the_budget_evicts_the_least_recently_used_entry_no_one_uses(tmp_path):
    cache = NodeCache(tmp_path / "cache", budget_bytes=2500, grace_seconds=0)
    uris = [make_model(tmp_path / name, name * 3) for name in ("a", "b", "c")]
    digests = []
    for uri in uris[:2]:
        digests.append(cache.ensure(uri, None, lambda f, u=uri: fetch.fetch(u, f, show_progress=False)).entry.digest)
        time.sleep(0.02)
    # "a" was used least recently; using it again makes "b" the one to go.
    assert cache.ensure(uris[0], None, lambda f: pytest.fail("must not fetch")).fetched is False
    cache.ensure(uris[2], None, lambda f: fetch.fetch(uris[2], f, show_progress=False))
    held = {e.digest for e in cache.entries()}
    assert digests[0] in held and digests[1] not in held and len(held) == 2


def test_an_entry_in_use_is_never_evicted_and_a_model_that_cannot_fit_is_refused(tmp_path, capsys):
    root = tmp_path / "cache"
    first = make_model(tmp_path / "a", "aaa")
    assert run_fetch(first, tmp_path / "pod1" / "model", root, budget=1500) == 0
    cache = NodeCache(root, budget_bytes=1500, grace_seconds=0)
    lease = lease_for(tmp_path / "pod1" / "model")  # what `serve` holds for its life
    assert lease is not None
    with lease:
        assert cache.in_use(cache.entries()[0].digest)
        second = make_model(tmp_path / "b", "bbb")
        with pytest.raises(CacheFullError, match="cannot fit without evicting a model in use"):
            cache.ensure(second, None, lambda f: fetch.fetch(second, f, show_progress=False))
        assert [e.digest for e in cache.entries()] == [content_digest(content_manifest(tmp_path / "a"))]
        assert list((root / "staging").iterdir()) == []
    assert not cache.in_use(cache.entries()[0].digest)
    # Once the lease is gone and the grace period over (fetch's default: 10 minutes), the older entry makes room.
    old = time.time() - 601
    os.utime(root / "locks" / f"{cache.entries()[0].digest}.use", (old, old))
    assert run_fetch(second, tmp_path / "pod2" / "model", root, budget=1500) == 0
    assert [e.digest for e in cache.entries()] == [content_digest(content_manifest(tmp_path / "b"))]


def test_fetch_reports_a_full_cache_with_its_own_exit_code(tmp_path, capsys):
    uri = make_model(tmp_path / "src", "zeta", size=4000)
    assert run_fetch(uri, tmp_path / "pod" / "model", tmp_path / "cache", budget=100) == fetch.CACHE_FULL_EXIT_CODE
    assert "node cache's budget is 100 bytes" in capsys.readouterr().err
    assert not (tmp_path / "pod" / "model").exists()


def test_an_entry_handed_out_within_the_grace_period_counts_as_in_use(tmp_path):
    uri = make_model(tmp_path / "src", "eta")
    cache = NodeCache(tmp_path / "cache", grace_seconds=600)
    digest = cache.ensure(uri, None, lambda f: fetch.fetch(uri, f, show_progress=False)).entry.digest
    assert cache.in_use(digest)
    use = cache.root / "locks" / f"{digest}.use"
    os.utime(use, (time.time() - 601, time.time() - 601))
    assert not cache.in_use(digest)


def test_fetch_refuses_to_replace_a_folder_with_files_and_needs_the_cache_for_a_budget(tmp_path, capsys):
    uri = make_model(tmp_path / "src", "theta")
    to = tmp_path / "pod" / "model"
    to.mkdir(parents=True)
    (to / "keep.txt").write_text("mine")
    assert run_fetch(uri, to, tmp_path / "cache") == 1
    assert (to / "keep.txt").read_text() == "mine"
    args = argparse.Namespace(uri=uri, to=to, no_progress=True, revision=None, node_cache=None, node_cache_budget=10)
    assert fetch.run(args) == 2
    assert "--node-cache-budget needs --node-cache" in capsys.readouterr().err


def test_lease_for_a_model_outside_the_cache_is_none(tmp_path):
    make_model(tmp_path / "src", "iota")
    assert lease_for(tmp_path / "src") is None
