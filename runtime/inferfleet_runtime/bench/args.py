"""Argument checks and the error exit shared by the bench commands (`bench serve`, `bench compare`)."""

from __future__ import annotations

import argparse
import sys


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def fail(message: str, code: int = 2) -> int:
    print(f"inferfleet-runtime bench: error: {message}", file=sys.stderr)
    return code
