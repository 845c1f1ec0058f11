"""API keys for the OpenAI endpoints: where they come from (flags, environment, mounted files) and the
constant-time check of a request's `Authorization: Bearer` header."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "INFERFLEET_API_KEY"  # several keys separated by commas; the operator sets it from a Secret
MAX_KEY_BYTES = 4096


class ApiKeyError(ValueError):
    """A key source is unreadable or gives an unusable key."""


@dataclass(frozen=True)
class ApiKeys:
    keys: tuple[bytes, ...]

    @classmethod
    def from_sources(
        cls, flag_keys: Iterable[str] = (), env_value: str | None = None, key_files: Iterable[str | Path] = ()
    ) -> ApiKeys | None:
        """Every key given by --api-key, the environment variable and --api-key-file (one key a line, blank and
        '#' lines skipped); None when no source gives one (the endpoints stay open)."""
        found = [("--api-key", key) for key in flag_keys]
        found += [(ENV_VAR, key) for key in (env_value or "").split(",") if key.strip()]
        for path in key_files:
            try:
                text = Path(path).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ApiKeyError(f"cannot read API key file {path}: {exc}") from None
            lines = [line.strip() for line in text.splitlines()]
            keys = [line for line in lines if line and not line.startswith("#")]
            if not keys:
                raise ApiKeyError(f"API key file {path} holds no key")
            found += [(str(path), key) for key in keys]
        checked = []
        for source, key in found:
            key = key.strip()
            if not key or any(c.isspace() or not c.isprintable() for c in key) or len(key.encode()) > MAX_KEY_BYTES:
                raise ApiKeyError(
                    f"an API key from {source} is empty, has spaces or control characters, or is over "
                    f"{MAX_KEY_BYTES} bytes"
                )
            checked.append(key.encode())
        return cls(tuple(dict.fromkeys(checked))) if checked else None

    def allows(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries one of the keys. Every key is compared, in constant time each,
        so the time taken does not tell which key (or how much of one) matched."""
        scheme, _, token = (authorization or "").partition(" ")
        given = token.strip().encode("utf-8", "surrogateescape") if scheme.lower() == "bearer" else b""
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(given, key)
        return matched and bool(given)
