"""`inferfleet-runtime fetch`: downloads a model directory from file://, hf:// or s3:// into a local folder, resumably."""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from tqdm import tqdm

from inferfleet_runtime.fetch.common import CREDENTIALS_HINT, FetchError, target_path, verify_sizes, wrong_sizes
from inferfleet_runtime.fetch.content_digest import write_source
from inferfleet_runtime.fetch.node_cache import CacheFullError, NodeCache
from inferfleet_runtime.sizes import parse_size
from inferfleet_runtime.termination import fail

URI_FORMS = "file:///path/to/model, hf://org/name[@revision] or s3://bucket/prefix"


class BadURIError(ValueError):
    """The URI is not one fetch understands."""


@dataclass(frozen=True)
class Source:
    scheme: str  # "file" | "hf" | "s3"
    path: str  # file: local directory; hf: "org/name"; s3: "bucket/prefix" (no trailing /)
    revision: str | None = None  # hf only; None means the repository's default branch


def parse_uri(uri: str, revision: str | None = None) -> Source:
    """`revision` (the --revision flag) must agree with an @revision in an hf:// URI; other schemes have none."""
    source = _parse(uri)
    if revision is None:
        return source
    if source.scheme != "hf":
        raise BadURIError(
            f"--revision {revision!r} applies to hf:// only, not {uri!r}: leave spec.model.revision unset"
        )
    if source.revision not in (None, revision):
        raise BadURIError(f"{uri!r} names revision {source.revision!r} but --revision is {revision!r}")
    return Source("hf", source.path, revision)


def _parse(uri: str) -> Source:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise BadURIError(f"bad file URI {uri!r}: expected {URI_FORMS}")
        return Source("file", unquote(parsed.path))
    if parsed.scheme == "hf":
        repo, _, revision = (parsed.netloc + parsed.path).partition("@")
        parts = repo.strip("/").split("/")
        if len(parts) != 2 or not all(parts) or (revision == "" and "@" in uri):
            raise BadURIError(f"bad hf URI {uri!r}: expected {URI_FORMS}")
        return Source("hf", "/".join(parts), revision or None)
    if parsed.scheme == "s3":
        prefix = unquote(parsed.path).strip("/")
        if not parsed.netloc or not prefix or parsed.query or parsed.fragment:
            raise BadURIError(f"bad s3 URI {uri!r}: expected {URI_FORMS}")
        return Source("s3", f"{parsed.netloc}/{prefix}")
    if parsed.scheme == "pvc":
        raise BadURIError(f"{uri!r}: pvc:// volumes are mounted into the pod, not fetched")
    raise BadURIError(f"unsupported URI {uri!r}: expected {URI_FORMS}")


def fetch(uri: str, to: Path, show_progress: bool = True, revision: str | None = None) -> Path:
    """Copies or downloads the model into `to`; files already complete there are kept (re-runs resume)."""
    source = parse_uri(uri, revision)
    to.mkdir(parents=True, exist_ok=True)
    if source.scheme == "file":
        _fetch_local(Path(source.path), to, show_progress)
    elif source.scheme == "s3":
        from inferfleet_runtime.fetch.s3 import fetch_s3

        fetch_s3(source.path, to, show_progress)
    else:
        _fetch_hub(source, to, show_progress)
    return to


def _fetch_local(src: Path, to: Path, show_progress: bool) -> None:
    if not src.is_dir():
        raise FetchError(f"{src} is not a directory")
    files = sorted(p for p in src.rglob("*") if p.is_file())
    root = src.resolve()
    for path in files:  # a symlink may point anywhere on the node: only what stays inside the model folder is copied
        if not path.resolve().is_relative_to(root):
            raise FetchError(f"refusing {path}: it is a symlink to {path.resolve()}, outside {src}")
    sizes = {p.relative_to(src): p.stat().st_size for p in files}
    with tqdm(
        total=sum(sizes.values()),
        unit="B",
        unit_scale=True,
        desc=f"Copying {src.name}",
        disable=not show_progress,
        file=sys.stderr,
    ) as bar:
        for rel, size in sizes.items():
            dest = target_path(to, rel.as_posix())
            if dest.is_file() and dest.stat().st_size == size:  # finished by an earlier run
                bar.update(size)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            with open(src / rel, "rb") as reader, open(part, "wb") as writer:
                while chunk := reader.read(1 << 20):
                    writer.write(chunk)
                    bar.update(len(chunk))
            os.replace(part, dest)
    verify_sizes(to, {str(rel): size for rel, size in sizes.items()})


# What `serve` and `compile` read from a checkpoint (loader, tokenizer, gguf_checkpoint): an hf:// fetch downloads
# only these, not the other formats a repository may also carry (PyTorch .bin, original/*.pth, ONNX, ...).
SERVED_FILES = ("*.json", "*.safetensors", "*.jinja", "*.gguf")


def is_served_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in SERVED_FILES)


def wrong_checksums(root: Path, siblings) -> list[str]:
    """The files under root whose bytes do not hash to what the hub lists: sha256 for files stored with Git LFS,
    else the git blob id (sha1 of "blob <size>\\0" + bytes)."""
    bad = []
    for sibling in siblings:
        path = root / sibling.rfilename
        if not path.is_file():
            continue
        if sibling.lfs is not None:
            digest, expected = hashlib.sha256(), sibling.lfs.sha256
        elif sibling.blob_id:
            digest, expected = hashlib.sha1(b"blob %d\0" % path.stat().st_size), sibling.blob_id
        else:
            continue
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            bad.append(sibling.rfilename)
    return bad


def _fetch_hub(source: Source, to: Path, show_progress: bool) -> None:
    # Imported here so file:// works without huggingface_hub; endpoint and token are read at call time so
    # HF_ENDPOINT / HF_TOKEN set after import still count.
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    endpoint = os.environ.get("HF_ENDPOINT") or None
    token = os.environ.get("HF_TOKEN") or None
    revision = source.revision or "main"
    (enable_progress_bars if show_progress else disable_progress_bars)()
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(source.path, revision=revision, files_metadata=True)
        siblings = [s for s in info.siblings or [] if is_served_file(s.rfilename)]
        expected = {s.rfilename: s.size for s in siblings if s.size is not None}
        # Pinning the resolved commit keeps the listing and the files consistent if the branch moves meanwhile.
        snapshot_download(
            source.path, revision=info.sha, local_dir=to, endpoint=endpoint, token=token,
            allow_patterns=list(SERVED_FILES),
        )  # fmt: skip

        def download_again(name: str) -> None:
            hf_hub_download(
                source.path, name, revision=info.sha, local_dir=to, endpoint=endpoint, token=token, force_download=True
            )

        # The library trusts its own bookkeeping for files it finished earlier; re-download any whose size
        # no longer matches (truncated or edited since), then any whose bytes are not the hub's.
        for name in wrong_sizes(to, expected):
            download_again(name)
        for name in wrong_checksums(to, siblings):
            download_again(name)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise FetchError(
            f"could not fetch hf://{source.path}@{revision}: {_reason(exc, has_token=token is not None)}"
        ) from exc
    verify_sizes(to, expected)
    if bad := wrong_checksums(to, siblings):
        raise FetchError(
            f"could not fetch hf://{source.path}@{revision}: {bad[0]} does not match the hub's checksum after a "
            f"second download ({len(bad)} file(s) differ)"
        )
    # The commit the revision resolved to: a compile of these files is addressed by it (model_content).
    write_source(to, f"hf://{source.path}", revision, info.sha)


def _reason(exc: Exception, has_token: bool) -> str:
    """One line for the pod's log. Never includes the token: library messages are cut to their first line,
    which names the repository and status, not request headers."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        if not has_token:
            return (
                f"access refused (gated or private model) and HF_TOKEN is not set: put HF_TOKEN in {CREDENTIALS_HINT}"
            )
        return f"access refused with the token in HF_TOKEN (from {CREDENTIALS_HINT}): check it is valid and has access"
    if isinstance(exc, RevisionNotFoundError):
        return "revision not found"
    if isinstance(exc, RepositoryNotFoundError):
        if not has_token:
            return f"repository not found (a private model needs HF_TOKEN from {CREDENTIALS_HINT})"
        return "repository not found (or no access with this token)"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--uri", required=True, help=URI_FORMS)
    parser.add_argument("--to", required=True, type=Path, help="local directory to fill")
    parser.add_argument("--revision", help="hf:// only: branch, tag or commit (same as hf://org/name@REVISION)")
    parser.add_argument("--no-progress", action="store_true", help="do not draw progress bars")
    parser.add_argument(
        "--node-cache",
        type=Path,
        metavar="DIR",
        help="the node's model cache (fetch/node_cache.py): the model is fetched into it once per node and verified "
        "by its content digest; --to becomes a link to the entry",
    )
    parser.add_argument(
        "--node-cache-budget",
        type=parse_size,
        metavar="SIZE",
        help="with --node-cache: the cache's byte budget (e.g. 50GiB); entries no process uses are evicted, least "
        "recently used first, and a model that cannot fit fails the fetch (exit 4)",
    )


CACHE_FULL_EXIT_CODE = 4  # the model does not fit the node cache's budget: the operator reports it, retrying waits


def run(args: argparse.Namespace) -> int:
    revision = getattr(args, "revision", None)
    node_cache = getattr(args, "node_cache", None)
    if getattr(args, "node_cache_budget", None) is not None and node_cache is None:
        return fail("inferfleet-runtime fetch", "--node-cache-budget needs --node-cache", 2)
    try:
        if node_cache is None:
            fetch(args.uri, args.to, show_progress=not args.no_progress, revision=revision)
            print(f"Fetched {args.uri} into {args.to}", file=sys.stderr)
        else:
            _fetch_through_cache(args, node_cache, revision)
    except BadURIError as exc:  # the error line is also the termination message the operator reports
        return fail("inferfleet-runtime fetch", str(exc), 2)
    except CacheFullError as exc:
        return fail("inferfleet-runtime fetch", str(exc), CACHE_FULL_EXIT_CODE)
    except (FetchError, ValueError) as exc:
        return fail("inferfleet-runtime fetch", str(exc), 1)
    return 0


def _fetch_through_cache(args: argparse.Namespace, root: Path, revision: str | None) -> None:
    """The model's verified node-cache entry (fetched only when the node has none), and --to a link to it."""
    parse_uri(args.uri, revision)  # a bad URI fails before the cache is touched
    cache = NodeCache(root, args.node_cache_budget)
    resolved = cache.ensure(
        args.uri,
        revision,
        lambda folder: fetch(args.uri, folder, show_progress=not args.no_progress, revision=revision),
        wait_log=lambda line: print(line, file=sys.stderr),
    )
    if resolved.refused:
        print(f"Refused a node-cache entry: {resolved.refused}", file=sys.stderr)
    link_to(args.to, resolved.entry.path)
    how = "fetched into" if resolved.fetched else "found in"
    print(
        f"{args.uri}: {how} the node cache as entry {resolved.entry.digest} ({resolved.entry.size} bytes); "
        f"{args.to} links to it",
        file=sys.stderr,
    )


def link_to(to: Path, entry: Path) -> None:
    """Makes `to` a symlink to the entry: replaces an earlier link, or an empty folder (an init container's
    mount point); anything else there is refused rather than deleted."""
    if to.is_symlink():
        to.unlink()
    elif to.is_dir():
        if any(to.iterdir()):
            raise FetchError(f"{to} is a folder with files in it: --to must be empty or absent with --node-cache")
        to.rmdir()
    elif to.exists():
        raise FetchError(f"{to} is a file: --to must be a folder's path with --node-cache")
    to.parent.mkdir(parents=True, exist_ok=True)
    to.symlink_to(entry.resolve(), target_is_directory=True)
