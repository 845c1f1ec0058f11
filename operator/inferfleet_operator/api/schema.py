"""The one declaration of the API: a field's type, default, bounds, enum, description and CEL rules are written once,
on a pydantic model, and read from there by the parser (`parse`) and the CRD generator (`openapi`)."""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# The order crdgen has always written a schema node's keys in (the committed CRDs read this way).
_KEY_ORDER = (
    "type format description properties additionalProperties items minimum maximum enum pattern maxLength maxItems "
    "maxProperties x-kubernetes-list-type x-kubernetes-list-map-keys minItems required default x-kubernetes-validations"
).split()
_SCALARS = {bool: "boolean", int: "integer", str: "string"}


class SpecError(ValueError):
    """A spec the API server should have refused (the CRD's CEL rules); names the field."""


def to_camel(name: str) -> str:
    """snake_case -> camelCase, the single mapping rule for every field of every kind."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class Model(BaseModel):
    """An API object: immutable, camelCase on the wire and snake_case in Python, unknown keys ignored.

    Only types and presence are checked in Python (strictly: "2" is no integer, "yes" no boolean); bounds, enums,
    patterns and CEL rules are the API server's to enforce, from the CRD generated out of the same fields. A class's
    docstring is its schema description where the field that holds it gives none; RULES are the CEL rules of every
    object of the class."""

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        protected_namespaces=(),
    )
    RULES: typing.ClassVar[tuple[dict, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _as_the_api_reads(cls, data: Any) -> Any:
        """A null field reads as an absent one (its default, or "is required"), an empty value where an object is
        wanted as {}, and whatever a string field holds as its str(): as the operator has always read specs."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        for key, kind in _loose_fields(cls).items():
            value = data.get(key)
            if value is None or (kind == "str" and isinstance(value, str)):
                continue
            if kind == "str":
                data[key] = str(value)
            elif kind == "strs" and isinstance(value, list):
                data[key] = [str(v) for v in value]
            elif kind == "map" and isinstance(value, dict):
                data[key] = {str(k): str(v) for k, v in value.items()}
            elif kind == "model" and not value:
                data[key] = {}
            elif kind == "models" and isinstance(value, list):
                data[key] = [v or {} for v in value]
        return data


def rule(expression: str, message: str, **extra) -> dict:
    """A CEL rule (x-kubernetes-validations entry); extra: fieldPath, reason, messageExpression."""
    return {"rule": expression, "message": message, **extra}


def field(
    default: Any = ...,
    description: str = "",
    *,
    factory: typing.Callable[[], Any] | None = None,
    crd_default: Any = PydanticUndefined,
    bounds: tuple[int, int] | None = None,
    enum: typing.Iterable | None = None,
    pattern: str | None = None,
    max_length: int | None = None,
    max_items: int | None = None,
    min_items: int | None = None,
    list_type: str = "atomic",
    map_keys: tuple[str, ...] = (),
    max_properties: int | None = None,
    items: dict | None = None,
    values: dict | None = None,
    format: str | None = None,  # noqa: A002 - the OpenAPI keyword
    rules: typing.Iterable[dict] = (),
) -> Any:
    """A field with its schema: `...` (required), a default or a factory; the OpenAPI keywords the CRD adds.

    The CRD's default is the model's, except that empty ones ("", [], {}) are left out (absent already means
    empty); crd_default overrides that. items/values: keywords of an array's items, a map's values."""
    extra: dict[str, Any] = {}
    if bounds is not None:
        extra["minimum"], extra["maximum"] = bounds
    for key, value in (
        ("enum", list(enum) if enum is not None else None),
        ("pattern", pattern),
        ("maxLength", max_length),
        ("maxItems", max_items),
        ("minItems", min_items),
        ("maxProperties", max_properties),
        ("format", format),
        ("items", items),
        ("additionalProperties", values),
    ):
        if value is not None:
            extra[key] = value
    if max_items is not None:
        extra["x-kubernetes-list-type"] = list_type
    if map_keys:
        extra["x-kubernetes-list-map-keys"] = list(map_keys)
    if rules:
        extra["x-kubernetes-validations"] = list(rules)
    if crd_default is not PydanticUndefined:
        extra["default"] = crd_default
    if factory is not None:
        return Field(default_factory=factory, description=description, json_schema_extra=extra)
    return Field(default, description=description, json_schema_extra=extra)


def item(description: str, **keywords) -> dict:
    """The schema of a list's scalar items (field(items=...)): a description and OpenAPI keywords."""
    return {"description": description, **keywords}


# ---------------------------------------------------------------- parsing

_MESSAGES = {
    "missing": "is required",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "tuple_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
}


def parse(cls: type[Model], data: Any, path: str = "spec") -> Any:
    """Model `cls` from a camelCase dict (None: {}), defaults filled; SpecError names the first bad field."""
    try:
        return cls.model_validate({} if data is None else data)
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        where = path + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
        raise SpecError(f"{where} {_MESSAGES.get(first['type'], first['msg'])}") from None


def dump(obj: Model) -> dict:
    """Model -> camelCase dict with every field (defaults included); None values are dropped, maps sorted."""
    out = {}
    for name, alias, _, _ in _fields(type(obj)):
        value = getattr(obj, name)
        if value is not None:
            out[alias] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Model):
        return dump(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return dict(sorted(value.items()))
    return value


# ---------------------------------------------------------------- the CRD schema


def openapi(cls: type[Model], description: str | None = None) -> dict:
    """The OpenAPI v3 schema of model `cls` (an object node), as the CRD carries it."""
    properties = {alias: _field_schema(annotation, info) for _, alias, annotation, info in _fields(cls)}
    node: dict[str, Any] = {
        "type": "object",
        "description": description if description is not None else _doc(cls),
        "properties": properties,
    }
    required = [alias for _, alias, _, info in _fields(cls) if info.is_required()]
    if required:
        node["required"] = required
    if cls.RULES:
        node["x-kubernetes-validations"] = list(cls.RULES)
    return node


@functools.cache
def _fields(cls: type[Model]) -> tuple[tuple[str, str, Any, FieldInfo], ...]:
    """(python name, camelCase key, type, FieldInfo) per field, in declaration order."""
    return tuple((name, info.alias or to_camel(name), info.annotation, info) for name, info in cls.model_fields.items())


@functools.cache
def _loose_fields(cls: type[Model]) -> dict[str, str]:
    """Python name and camelCase key -> how Model._as_the_api_reads loosens the field's value."""
    kinds = {}
    for name, alias, annotation, _ in _fields(cls):
        inner = _unwrap(annotation)
        origin, args = typing.get_origin(inner), typing.get_args(inner)
        if inner is str:
            kind = "str"
        elif origin is tuple:
            kind = "models" if _is_model(_unwrap(args[0])) else "strs" if _unwrap(args[0]) is str else ""
        elif origin is dict:
            kind = "map"
        else:
            kind = "model" if _is_model(inner) else ""
        if kind:
            kinds[name] = kinds[alias] = kind
    return kinds


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Model)


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _field_schema(annotation: Any, info: FieldInfo) -> dict:
    extra = dict(info.json_schema_extra or {})
    node = _type_schema(_unwrap(annotation), info.description, extra)
    if "default" not in extra and not info.is_required():
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            node["default"] = {}
        elif default not in (None, "", (), {}):
            node["default"] = default
    node.update(extra)
    return _ordered(node)


def _type_schema(annotation: Any, description: str | None, extra: dict) -> dict:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _is_model(annotation):
        node = openapi(annotation, description or None)
        rules = node.pop("x-kubernetes-validations", []) + extra.pop("x-kubernetes-validations", [])
        if rules:
            node["x-kubernetes-validations"] = rules
        return node
    if origin is tuple:
        inner = _unwrap(args[0])
        if _is_model(inner):
            items = openapi(inner)
        else:
            items = _ordered({"type": _SCALARS[inner], **extra.pop("items", {})})
        return {"type": "array", "description": description, "items": items}
    if origin is dict:
        values = {"type": "string", **extra.pop("additionalProperties", {})}
        return {"type": "object", "description": description, "additionalProperties": values}
    return {"type": _SCALARS[annotation], "description": description}


def _unwrap(annotation: Any) -> Any:
    """X from X | None and Annotated[X, ...] (StrictInt is Annotated[int, Strict()])."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _ordered(node: dict) -> dict:
    return {key: node[key] for key in _KEY_ORDER if key in node}
