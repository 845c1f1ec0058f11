"""Operator tests: helper modules in this folder (crd_eval, planning_data) import by name under --import-mode=importlib."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
