"""Kubernetes quantities ("500m", "8Gi", "1e3", 2) as numbers: the operator's one parser of them."""

from __future__ import annotations

import decimal
import re
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]{0,2})$")
_SUFFIXES = {
    "": 1,
    "m": decimal.Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value: Any) -> decimal.Decimal | None:
    """A Kubernetes quantity ("500m", "8Gi", 2) as a number; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return decimal.Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value)
    if not match:
        return None
    number, suffix = match.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return decimal.Decimal(number + suffix)
        if suffix not in _SUFFIXES:
            return None
        return decimal.Decimal(number) * _SUFFIXES[suffix]
    except decimal.InvalidOperation:
        return None


def to_int(value: Any) -> int:
    """A quantity as a whole number (allocatable GPUs, a limit of 2), truncated; 0 when it is not one."""
    return int(parse_quantity(value) or 0)


def to_millis(value: Any) -> int:
    """A CPU quantity ("4", "3500m", "0.5") in millicores, truncated; 0 when it is not one."""
    return int((parse_quantity(value) or 0) * 1000)
