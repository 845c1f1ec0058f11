"""Small builders of OpenAPI v3 schema nodes with CEL rules, for crdgen."""

from __future__ import annotations


def rule(expression: str, message: str, **extra) -> dict:
    return {"rule": expression, "message": message, **extra}


def string(description: str, default=None, enum=None, pattern=None, max_length=None, rules=None) -> dict:
    out = {"type": "string", "description": description}
    if enum is not None:
        out["enum"] = list(enum)
    if pattern is not None:
        out["pattern"] = pattern
    if max_length is not None:
        out["maxLength"] = max_length
    if default is not None:
        out["default"] = default
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def integer(description: str, default=None, bounds=None, enum=None, rules=None) -> dict:
    out = {"type": "integer", "description": description}
    if bounds is not None:
        out["minimum"], out["maximum"] = bounds
    if enum is not None:
        out["enum"] = list(enum)
    if default is not None:
        out["default"] = default
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def boolean(description: str, default=None) -> dict:
    out = {"type": "boolean", "description": description}
    if default is not None:
        out["default"] = default
    return out


def obj(description: str, properties: dict, required=(), default=None, rules=None) -> dict:
    out = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = list(required)
    if default is not None:
        out["default"] = default
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def array(
    description: str, items: dict, max_items: int, list_type="atomic", keys=None, rules=None, min_items=None
) -> dict:
    out = {
        "type": "array",
        "description": description,
        "items": items,
        "maxItems": max_items,
        "x-kubernetes-list-type": list_type,
    }
    if keys:
        out["x-kubernetes-list-map-keys"] = list(keys)
    if min_items is not None:
        out["minItems"] = min_items
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def string_map(description: str, max_properties: int) -> dict:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string"},
        "maxProperties": max_properties,
    }


def column(name: str, path: str, type_: str = "string", description: str = "") -> dict:
    out = {"name": name, "type": type_, "jsonPath": path}
    if description:
        out["description"] = description
    return out
