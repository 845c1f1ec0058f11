"""What every fetch source shares: its error, the credentials hint its messages give, where a fetched file may land,
and the size check of what it wrote."""

from __future__ import annotations

from pathlib import Path

CREDENTIALS_HINT = "the Secret named by spec.model.credentialsSecret"


class FetchError(RuntimeError):
    """The source could not be fetched (missing, unreachable, incomplete)."""


def wrong_sizes(to: Path, expected: dict[str, int]) -> list[str]:
    return [name for name, size in expected.items() if _size(to / name) != size]


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def verify_sizes(to: Path, expected: dict[str, int]) -> None:
    for name in wrong_sizes(to, expected):
        actual = _size(to / name)
        raise FetchError(
            f"{to / name}: expected {expected[name]} bytes, found {'no file' if actual is None else actual}"
        )


def target_path(to: Path, rel: str) -> Path:
    """Where the source file named `rel` lands under `to`; FetchError for a name that would land anywhere else: an
    absolute path, empty, `.` or `..` parts (`a//b`, `../x`), a NUL or a backslash, or a folder under `to` that is
    a symlink leading out of it."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise FetchError(f"refusing the file name {rel!r}: it would be written outside the target {to}")
    dest = to.joinpath(*parts)
    if not dest.parent.resolve().is_relative_to(to.resolve()):
        raise FetchError(f"refusing the file name {rel!r}: {dest.parent} leads outside the target {to}")
    return dest
