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
