"""The router's flags and profile file: what they give, and one readable line (exit 2) for what they cannot."""

from __future__ import annotations

import json

import pytest

from inferfleet_operator.plan.endpoint_picker import PoolProfile
from inferfleet_operator.router.config import (
    DEFAULT_POOL,
    ConfigError,
    EndpointSpec,
    PoolAddress,
    build_parser,
    config_from_args,
    parse_endpoint,
    parse_pool_address,
    parse_profiles,
)
from inferfleet_operator.router.main import main

PROFILE = {
    "prefill": [[128, 9000], [2048, 20000]],
    "decode": [[1, 100], [64, 2600]],
    "max_batch": 64,
    "kv_capacity_tokens": 300000,
    "block_size": 16,
    "has_prefix_cache": True,
}


def test_an_endpoint_flag_gives_its_url_without_a_trailing_slash_and_its_pool():
    assert parse_endpoint("http://10.0.0.7:8000/,pool=nvidia-h100") == EndpointSpec(
        "http://10.0.0.7:8000", "nvidia-h100"
    )
    assert parse_endpoint("https://pod.example:8443") == EndpointSpec("https://pod.example:8443", DEFAULT_POOL)


@pytest.mark.parametrize(
    "value", ["10.0.0.7:8000", "ftp://h:1", "http://h:1/v1", "http://h:1,zone=a", "http://h:1,pool="]
)
def test_a_bad_endpoint_flag_is_refused(value):
    with pytest.raises(ConfigError, match="--endpoint"):
        parse_endpoint(value)


def test_a_profile_file_gives_the_pickers_pool_profiles():
    profiles = parse_profiles(json.dumps({"nvidia-h100": PROFILE}), "p.json")
    assert profiles["nvidia-h100"] == PoolProfile(
        ((128, 9000), (2048, 20000)), ((1, 100), (64, 2600)), 64, 300000, 16, True
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"max_batch": None}, "missing ['max_batch']"),
        ({"speed": 2}, "unknown ['speed']"),
        ({"decode": [[1, -5]]}, "finite and positive"),
        ({"decode": [[1, "fast"]]}, "pairs of numbers"),
        ({"block_size": 16.5}, "block_size must be an integer"),
        ({"has_prefix_cache": "yes"}, "true or false"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_pool_and_field(change, words):
    profile = {k: v for k, v in {**PROFILE, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match="p.json: pool 'a'") as caught:
        parse_profiles(json.dumps({"a": profile}), "p.json")
    assert words in str(caught.value)


def test_flags_give_keys_and_the_upstream_key_read_from_a_file(tmp_path):
    (tmp_path / "upstream").write_text("# the pods' key\npod-key\n")
    args = build_parser().parse_args(
        ["--endpoint", "http://127.0.0.1:1", "--api-key", "k1", "--upstream-api-key-file", str(tmp_path / "upstream")]
    )
    config = config_from_args(args)
    assert config.api_keys.allows("Bearer k1") and not config.api_keys.allows("Bearer pod-key")
    assert config.upstream_api_key == "pod-key"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "at least one --endpoint or --pool-address"),
        (["--pool-address", "a=h:1", "--pool-address", "a=g:2"], "pool is given twice"),
        (["--pool-address", "a=h:1", "--resolve-interval", "0"], "--resolve-interval must be positive"),
        (["--endpoint", "http://h:1", "--api-key-env"], "INFERFLEET_API_KEY is unset or empty"),
        (["--endpoint", "http://h:1", "--endpoint", "http://h:1/"], "given twice"),
        (["--endpoint", "http://h:1", "--profile-file", "/nonexistent/p.json"], "cannot read /nonexistent/p.json"),
        (["--endpoint", "http://h:1", "--api-key", "has space"], "API key"),
        (["--endpoint", "http://h:1", "--max-attempts", "0"], "--max-attempts must be at least 1"),
    ],
)
def test_the_command_exits_2_with_one_readable_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inferfleet-router: ") and words in err[0]


def test_a_pool_address_flag_gives_the_pool_host_and_port():
    assert parse_pool_address("cpu-amd64=demo-cpu-amd64.ns.svc:8000") == PoolAddress(
        "cpu-amd64", "demo-cpu-amd64.ns.svc", 8000
    )


@pytest.mark.parametrize("value", ["h:1", "a=h", "a=:1", "a=h:0", "a=h:99999", "a=h:x", "a=h/x:1", "=h:1"])
def test_a_bad_pool_address_flag_is_refused(value):
    with pytest.raises(ConfigError, match="--pool-address"):
        parse_pool_address(value)


def test_keys_from_the_environment_are_asked_of_clients_and_the_first_is_sent_to_the_pods(monkeypatch):
    monkeypatch.setenv("INFERFLEET_API_KEY", "k1, k2")
    config = config_from_args(build_parser().parse_args(["--pool-address", "a=h:1", "--api-key-env"]))
    assert config.api_keys.allows("Bearer k1") and config.api_keys.allows("Bearer k2")
    assert config.upstream_api_key == "k1"
    with pytest.raises(ConfigError, match="no --upstream-api-key"):
        config_from_args(
            build_parser().parse_args(["--pool-address", "a=h:1", "--api-key-env", "--upstream-api-key", "x"])
        )
