"""RouterConfig: the router's flags (endpoints, pool profiles, keys, limits) parsed into one checked object."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from inferfleet_operator.plan.endpoint_picker import PoolProfile, profile_from_json
from inferfleet_runtime.server.auth import ENV_VAR, ApiKeyError, ApiKeys

FAIL_OPEN = "FailOpen"  # the picker raised: any ready endpoint serves the request
FAIL_CLOSE = "FailClose"  # the picker raised: 503
DEFAULT_POOL = "default"
MAX_BODY_BYTES = 8 << 20  # the runtime's own default limit
MAX_PROFILE_FILE_BYTES = 1 << 20

# A pool without a profile: slow rates (a small GPU's engine, tens of tokens/s per sequence), so observed rates only
# ever raise it (the picker moves a profile at most 4x, halfway), and a KV capacity so large the router never refuses
# a request for length itself (the pod checks the context length and answers 400).
DEFAULT_PROFILE = PoolProfile(
    prefill=((128, 200.0), (2048, 400.0)),
    decode=((1, 10.0), (8, 40.0), (32, 80.0)),
    max_batch=32,
    kv_capacity_tokens=1 << 30,
    block_size=16,
    has_prefix_cache=False,
)


class ConfigError(ValueError):
    """A flag or the profile file holds something the router cannot use; the message is one readable line."""


@dataclass(frozen=True)
class EndpointSpec:
    url: str  # scheme://host:port, no path and no trailing slash: the picker's address
    pool: str


@dataclass(frozen=True)
class PoolAddress:
    """Every address `host` resolves to, at `port`, is a serving pod of `pool` (a headless Service's name)."""

    pool: str
    host: str
    port: int


@dataclass(frozen=True)
class RouterConfig:
    endpoints: tuple[EndpointSpec, ...]
    pool_addresses: tuple[PoolAddress, ...] = ()  # re-resolved every resolve_interval_s
    profiles: Mapping[str, PoolProfile] = field(default_factory=dict)
    api_keys: ApiKeys | None = None  # None: the router's /v1 endpoints are open
    upstream_api_key: str | None = None  # sent to the pods in place of the client's key
    failure_mode: str = FAIL_CLOSE
    max_body_bytes: int = MAX_BODY_BYTES
    max_attempts: int = 3  # endpoints tried for one request before it fails with 503
    scrape_interval_s: float = 0.5  # under the picker's stale_after_s (2 s), so fresh metrics are the rule
    scrape_timeout_s: float = 1.0  # bounds each /metrics and /ready request
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 600.0  # the longest an upstream may stay silent (a long non-streamed answer)
    resolve_interval_s: float = 2.0  # how often pool addresses are resolved again
    # An address a pool's name stopped resolving to stays an endpoint this long: a removed pod still serves through
    # its preStop wait (10 s), while its replacement is being found and scraped; the scrape keeps checking it.
    keep_gone_s: float = 8.0
    # A request that finds no endpoint ready waits this long for one (a pool's only pod being replaced) before 503.
    endpoint_wait_s: float = 3.0


def parse_endpoint(value: str) -> EndpointSpec:
    """`URL[,pool=NAME]`: an http(s) URL of a serving pod, without a path."""
    url, *options = [part.strip() for part in value.split(",")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query:
        raise ConfigError(f"--endpoint {value!r}: expected http(s)://HOST:PORT[,pool=NAME]")
    pool = DEFAULT_POOL
    for option in options:
        key, sep, name = option.partition("=")
        if key != "pool" or not sep or not name:
            raise ConfigError(f"--endpoint {value!r}: expected pool=NAME after the URL, got {option!r}")
        pool = name
    return EndpointSpec(f"{parts.scheme}://{parts.netloc}", pool)


def parse_pool_address(value: str) -> PoolAddress:
    """`POOL=HOST:PORT`: every address HOST resolves to is a pod of POOL."""
    pool, sep, address = value.partition("=")
    host, colon, port = address.rpartition(":")
    if not sep or not pool or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--pool-address {value!r}: expected POOL=HOST:PORT")
    if any(c.isspace() or c in "/?#@" for c in host):
        raise ConfigError(f"--pool-address {value!r}: {host!r} is not a host name")
    return PoolAddress(pool, host, int(port))


def parse_profiles(text: str, source: str) -> dict[str, PoolProfile]:
    """{pool: {prefill: [[prompt tokens, tokens/s], ...], decode: [[batch, tokens/s], ...], max_batch,
    kv_capacity_tokens, block_size, has_prefix_cache}}: the PoolProfile fields, every one required."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected an object of pool name -> profile")
    return {str(pool): parse_profile(pool, value, source) for pool, value in data.items()}


def parse_profile(pool: str, value, source: str) -> PoolProfile:
    """One pool's profile from its JSON value (a profile file's entry, or a pod's /profile answer)."""
    try:
        return profile_from_json(value)
    except ValueError as exc:
        raise ConfigError(f"{source}: pool {pool!r}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferfleet-router", description="OpenAI-compatible router over serving pods, choosing by what each can do"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="URL[,pool=NAME]",
        help="a serving pod, e.g. http://10.0.0.7:8000,pool=nvidia-h100 (repeatable)",
    )
    parser.add_argument(
        "--pool-address",
        action="append",
        default=[],
        metavar="POOL=HOST:PORT",
        help="every address HOST resolves to (a headless Service: its ready pods) is a pod of POOL (repeatable)",
    )
    parser.add_argument("--resolve-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument(
        "--keep-gone",
        type=float,
        default=8.0,
        metavar="SECONDS",
        help="an address that stopped resolving stays this long",
    )
    parser.add_argument(
        "--endpoint-wait",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="a request that finds no endpoint ready waits this long for one before 503",
    )
    parser.add_argument("--profile-file", metavar="PATH", help="JSON: pool name -> PoolProfile fields")
    parser.add_argument("--api-key", action="append", default=[], metavar="KEY", help="key clients must send")
    parser.add_argument("--api-key-file", action="append", default=[], metavar="PATH", help="keys, one a line")
    parser.add_argument(
        "--api-key-env",
        action="store_true",
        help=f"clients must send one of the keys in ${ENV_VAR} (comma-separated); the first is sent to the pods",
    )
    parser.add_argument("--upstream-api-key", metavar="KEY", help="key sent to the pods (default: none)")
    parser.add_argument("--upstream-api-key-file", metavar="PATH", help="read the upstream key from a file")
    parser.add_argument("--failure-mode", choices=(FAIL_OPEN, FAIL_CLOSE), default=FAIL_CLOSE)
    parser.add_argument("--max-request-bytes", type=int, default=MAX_BODY_BYTES, metavar="BYTES")
    parser.add_argument("--max-attempts", type=int, default=3, metavar="N", help="endpoints tried per request")
    parser.add_argument("--scrape-interval", type=float, default=0.5, metavar="SECONDS")
    parser.add_argument("--scrape-timeout", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--connect-timeout", type=float, default=3.0, metavar="SECONDS")
    parser.add_argument("--read-timeout", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The config the flags ask for; ConfigError with one readable line on a bad value."""
    if not args.endpoint and not args.pool_address:
        raise ConfigError("at least one --endpoint or --pool-address is needed")
    endpoints = tuple(parse_endpoint(value) for value in args.endpoint)
    if len({e.url for e in endpoints}) != len(endpoints):
        raise ConfigError("an --endpoint URL is given twice")
    pool_addresses = tuple(parse_pool_address(value) for value in args.pool_address)
    if len({a.pool for a in pool_addresses}) != len(pool_addresses):
        raise ConfigError("a --pool-address pool is given twice")
    profiles = {}
    if args.profile_file:
        profiles = parse_profiles(_read(args.profile_file, MAX_PROFILE_FILE_BYTES), args.profile_file)
    if args.upstream_api_key and args.upstream_api_key_file:
        raise ConfigError("give --upstream-api-key or --upstream-api-key-file, not both")
    env_keys = os.environ.get(ENV_VAR) if args.api_key_env else None
    if args.api_key_env and not (env_keys or "").strip():
        raise ConfigError(f"--api-key-env: ${ENV_VAR} is unset or empty")
    if args.api_key_env and (args.upstream_api_key or args.upstream_api_key_file):
        raise ConfigError("--api-key-env sends its first key to the pods: no --upstream-api-key(-file) with it")
    try:
        api_keys = ApiKeys.from_sources(args.api_key, env_keys, args.api_key_file)
        upstream_keys = ApiKeys.from_sources(
            [args.upstream_api_key] if args.upstream_api_key else [],
            env_keys.split(",", 1)[0] if env_keys else None,
            [args.upstream_api_key_file] if args.upstream_api_key_file else [],
        )  # a file's first key is the one sent
    except ApiKeyError as exc:
        raise ConfigError(str(exc)) from None
    for name in ("max_request_bytes", "max_attempts"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("scrape_interval", "scrape_timeout", "connect_timeout", "read_timeout", "resolve_interval"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    for name in ("keep_gone", "endpoint_wait"):
        if not 0 <= getattr(args, name) <= 600:
            raise ConfigError(f"--{name.replace('_', '-')} must be between 0 and 600 seconds")
    return RouterConfig(
        endpoints=endpoints,
        pool_addresses=pool_addresses,
        profiles=profiles,
        api_keys=api_keys,
        upstream_api_key=upstream_keys.keys[0].decode() if upstream_keys else None,
        failure_mode=args.failure_mode,
        max_body_bytes=args.max_request_bytes,
        max_attempts=args.max_attempts,
        scrape_interval_s=args.scrape_interval,
        scrape_timeout_s=args.scrape_timeout,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        resolve_interval_s=args.resolve_interval,
        keep_gone_s=args.keep_gone,
        endpoint_wait_s=args.endpoint_wait,
    )


def _read(path: str, max_bytes: int) -> str:
    try:
        with open(Path(path), "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{path} is over {max_bytes} bytes")
    return data.decode("utf-8", "replace")
