"""Turn pydantic JSON Schemas into Kubernetes structural OpenAPI v3 schemas.

Owns: the conversion rules (inline ``$ref``, ``Optional`` → not required, ``Literal`` → ``enum``, JSON Schema 2020
exclusive bounds → OpenAPI 3.0 booleans, ``x-kubernetes-*`` extensions kept). Must not do: I/O or validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopd.resources._errors import ResourceError

_KEPT_SCALAR_KEYWORDS = (
    "description",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "uniqueItems",
    "nullable",
)


class SchemaConversionError(ResourceError, ValueError):
    """A model uses a JSON Schema construct that has no structural OpenAPI v3 equivalent."""


def structural_schema(json_schema: Mapping[str, Any]) -> dict[str, Any]:
    """Convert one pydantic ``model_json_schema()`` result (with its ``$defs``) to a structural schema."""
    defs = json_schema.get("$defs", {})
    return _convert(json_schema, defs)


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    name = ref.rsplit("/", 1)[-1]
    target = defs.get(name)
    if not isinstance(target, Mapping):
        raise SchemaConversionError(f"unresolvable $ref {ref!r}")
    merged = dict(target)
    merged.update({k: v for k, v in schema.items() if k != "$ref"})
    return _resolve(merged, defs)


def _convert(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    schema = _resolve(schema, defs)
    for union_key in ("anyOf", "oneOf"):
        if union_key in schema:
            options = [o for o in schema[union_key] if not (isinstance(o, Mapping) and o.get("type") == "null")]
            if len(options) != 1:
                raise SchemaConversionError(f"unions are not structural: {schema[union_key]!r}")
            merged = dict(_resolve(options[0], defs))
            merged.update({k: v for k, v in schema.items() if k not in (union_key, "default", "title")})
            return _convert(merged, defs)
    if "allOf" in schema and len(schema["allOf"]) == 1:
        merged = dict(_resolve(schema["allOf"][0], defs))
        merged.update({k: v for k, v in schema.items() if k != "allOf"})
        return _convert(merged, defs)

    out: dict[str, Any] = {}
    enum: list[Any] | None = None
    if "const" in schema:
        enum = [schema["const"]]
    elif "enum" in schema:
        enum = list(schema["enum"])
    kind = schema.get("type")
    if kind is None and enum is not None:
        kind = _type_of_values(enum)
    if kind is not None:
        out["type"] = kind
    if enum is not None:
        out["enum"] = enum
    for keyword in _KEPT_SCALAR_KEYWORDS:
        if keyword in schema:
            out[keyword] = schema[keyword]
    if schema.get("default") is not None and not isinstance(schema.get("default"), dict | list):
        out["default"] = schema["default"]
    for bound, base in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = schema.get(bound)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[base] = value
            out[bound] = True
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value

    if kind == "object":
        properties = schema.get("properties", {})
        if properties:
            out["properties"] = {name: _convert(sub, defs) for name, sub in properties.items()}
        required = schema.get("required")
        if required:
            out["required"] = list(required)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            out["additionalProperties"] = _convert(additional, defs)
        elif additional is True and not properties:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        items = schema.get("items")
        if isinstance(items, Mapping):
            out["items"] = _convert(items, defs)
        else:
            raise SchemaConversionError("arrays need an items schema")
    elif kind is None and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaConversionError(f"schema has no type: {dict(schema)!r}")
    return out


def _type_of_values(values: list[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "number"
    return "string"
