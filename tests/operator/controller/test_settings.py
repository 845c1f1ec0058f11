"""The operator's flags: every default comes from OperatorConfig, and --help says it."""

from __future__ import annotations

import dataclasses

import pytest

from inferfleet_operator.controller.settings import OperatorConfig, build_parser, parse_args

FIELDS = {f.name: f.default for f in dataclasses.fields(OperatorConfig)}
ACTIONS = {a.dest: a for a in build_parser()._actions if a.dest in FIELDS}


def test_every_setting_has_a_flag():
    assert set(ACTIONS) == set(FIELDS)


@pytest.mark.parametrize("name", sorted(set(FIELDS) - {"namespaces"}))
def test_every_flag_defaults_to_the_dataclass_default(name):
    assert ACTIONS[name].default == FIELDS[name]


def test_no_flags_give_the_dataclass_defaults():
    assert parse_args([], default_instance="pod-0") == OperatorConfig(instance="pod-0")


def test_help_shows_the_defaults():
    text = " ".join(build_parser().format_help().split())
    assert "(default: 8080)" in text and "(default: 1,2,5,10,30,60)" in text
    assert "(default: inferfleet-engine-cache)" in text


def test_scraper_labels_parse_into_sorted_pairs_and_malformed_ones_are_refused(capsys):
    config = parse_args(["--scraper-namespace=ops", "--scraper-labels=b=2,a=1"], default_instance="p")
    assert config.plan_settings().scraper_namespace == "ops"
    assert config.plan_settings().scraper_labels == (("a", "1"), ("b", "2"))
    with pytest.raises(SystemExit):
        parse_args(["--scraper-labels=novalue"], default_instance="p")
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_allowed_host_path_roots_are_repeatable_normalised_and_none_by_default(capsys):
    assert parse_args([], default_instance="p").plan_settings().host_path_roots == ()
    config = parse_args(
        ["--model-host-path-root=/srv/models/", "--model-host-path-root=//data//shared"], default_instance="p"
    )
    assert config.plan_settings().host_path_roots == ("/srv/models", "/data/shared")
    with pytest.raises(SystemExit):
        parse_args(["--model-host-path-root=models"], default_instance="p")
    assert "--model-host-path-root" in capsys.readouterr().err


def test_the_router_image_reaches_the_plan_and_no_image_means_no_router(capsys):
    assert parse_args([], default_instance="p").plan_settings().router_image == ""
    settings = parse_args(
        ["--router-image=inferfleet/operator:1", "--router-image-pull-policy=Never"], default_instance="p"
    ).plan_settings()
    assert (settings.router_image, settings.router_image_pull_policy) == ("inferfleet/operator:1", "Never")
    with pytest.raises(SystemExit):
        parse_args(["--router-image-pull-policy=Sometimes"], default_instance="p")
    assert "invalid choice" in capsys.readouterr().err
