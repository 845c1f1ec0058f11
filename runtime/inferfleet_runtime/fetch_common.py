"""What every fetch source shares: its error, the credentials hint its messages give, and the size check of
what it wrote."""

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
