"""An offline stand-in for the API server's CRD handling: structural defaulting, schema checks, and CEL rules (cel-python)."""

from __future__ import annotations

import copy
import functools
import operator
import re
from pathlib import Path

import celpy
import yaml

CRDS = Path(__file__).resolve().parents[3] / "crds"


def load_schema(file_name: str) -> dict:
    crd = yaml.safe_load((CRDS / file_name).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(value, schema: dict):
    """Fill `default`s the way the API server does: for absent properties, recursively into defaulted objects."""
    value = copy.deepcopy(value)
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
    elif schema.get("type") == "array" and isinstance(value, list):
        value = [apply_defaults(item, schema["items"]) for item in value]
    return value


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def schema_errors(value, schema: dict, path: str = "") -> list[str]:
    """Unknown fields (which the API server would prune), wrong types, enum/bounds/pattern/required violations."""
    errors = []
    kind = schema.get("type")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: not an integer"]
    elif kind in _TYPES and not isinstance(value, _TYPES[kind]):
        return [f"{path}: not a {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
        errors.append(f"{path}: {value} out of bounds")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{path}: too long")
    if kind == "object":
        props = schema.get("properties")
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(f"{path}.{name}: required")
        for name, item in value.items():
            if props is not None and name in props:
                errors += schema_errors(item, props[name], f"{path}.{name}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{name}")
            elif props is not None and schema.get("properties") and path != ".metadata":
                errors.append(f"{path}.{name}: unknown field")
    if kind == "array":
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: too many items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: too few items")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


_ENV = celpy.Environment()
_PROGRAMS: dict[str, object] = {}
# Kubernetes' CEL list library functions the rules use, which cel-python lacks.
_K8S_FUNCTIONS = {"sum": lambda items: functools.reduce(operator.add, items, celpy.celtypes.IntType(0))}


def _program(expression: str):
    if expression not in _PROGRAMS:
        _PROGRAMS[expression] = _ENV.program(_ENV.compile(expression), functions=_K8S_FUNCTIONS)
    return _PROGRAMS[expression]


def compile_all(schema: dict) -> int:
    """Compile every rule and messageExpression; returns how many were compiled (raises on a syntax error)."""
    count = 0
    for sub in _walk(schema):
        for r in sub.get("x-kubernetes-validations") or []:
            _program(r["rule"])
            count += 1
            if "messageExpression" in r:
                _program(r["messageExpression"])
    return count


def _walk(schema: dict):
    yield schema
    for sub in (schema.get("properties") or {}).values():
        yield from _walk(sub)
    if "items" in schema:
        yield from _walk(schema["items"])


def rule_failures(value, schema: dict, old=None, path: str = "") -> list[str]:
    """Messages of the CEL rules that fail for `value` (with `old` as oldSelf for transition rules)."""
    failures = []
    for r in schema.get("x-kubernetes-validations") or []:
        is_transition = "oldSelf" in r["rule"]
        if is_transition and old is None:
            continue
        bindings = {"self": celpy.json_to_cel(value)}
        if is_transition:
            bindings["oldSelf"] = celpy.json_to_cel(old)
        try:
            result = _program(r["rule"]).evaluate(bindings)
        except celpy.CELEvalError as error:  # the API server refuses these too ("no such key")
            result = error
        if isinstance(result, Exception) or not bool(result):
            failures.append(f"{path or '<root>'}: {r['message']}")
    if schema.get("type") == "object" and isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                old_sub = old.get(name) if isinstance(old, dict) else None
                failures += rule_failures(value[name], sub, old_sub, f"{path}.{name}")
    elif schema.get("type") == "array" and isinstance(value, list):
        for i, item in enumerate(value):
            failures += rule_failures(item, schema["items"], None, f"{path}[{i}]")
    return failures


def admit(obj: dict, file_name: str, old: dict | None = None) -> tuple[dict, list[str]]:
    """What the API server would store and what it would refuse: (defaulted object, errors)."""
    schema = load_schema(file_name)
    defaulted = apply_defaults(obj, schema)
    errors = schema_errors(defaulted, schema)
    if not errors:
        errors = rule_failures(defaulted, schema, apply_defaults(old, schema) if old else None)
    return defaulted, errors
