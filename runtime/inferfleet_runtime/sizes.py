"""A byte size on the command line ("2GiB", "500MB", "1048576"): the runtime's one size parser. The operator parses
Kubernetes quantities in inferfleet_operator/quantity.py; the runtime image does not ship the operator package, so it
cannot import that one, and the spellings differ (GiB here, Gi there)."""

from __future__ import annotations

import argparse

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """The size in bytes; argparse.ArgumentTypeError (its message names the forms) for anything else."""
    lowered = text.strip().lower()
    number = lowered.rstrip("kmgib")
    unit = lowered[len(number) :]
    try:
        return int(float(number) * UNITS[unit])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2GiB, 500MB, 1048576)") from None
