"""The operator's one quantity parser: what the API server writes, and what it would refuse."""

from __future__ import annotations

import decimal

import pytest

from inferfleet_operator.api.quantity import parse_quantity, to_int, to_millis


@pytest.mark.parametrize(
    "value, number",
    [
        ("8Gi", 8 * 2**30),
        ("500m", decimal.Decimal("0.5")),
        ("1k", 1000),
        ("1e3", 1000),
        ("0.5", decimal.Decimal("0.5")),
        (2, 2),
        (1.5, decimal.Decimal("1.5")),
    ],
)
def test_quantities_parse_to_their_value(value, number):
    assert parse_quantity(value) == number


@pytest.mark.parametrize("value", ["", "8GB", "abc", "1..2", True, None, [1]])
def test_what_is_not_a_quantity_parses_to_none(value):
    assert parse_quantity(value) is None


@pytest.mark.parametrize("text, millis", [("4", 4000), ("3500m", 3500), ("0.5", 500), ("", 0), (None, 0), (2, 2000)])
def test_cpu_quantities_parse_to_millicores(text, millis):
    assert to_millis(text) == millis


@pytest.mark.parametrize("value, count", [("8", 8), (4, 4), ("1k", 1000), ("none", 0), (None, 0)])
def test_counts_are_whole_numbers(value, count):
    assert to_int(value) == count
