"""Validate objects against a kind's structural OpenAPI v3 schema, pruning unknown fields and applying defaults.

Owns: schema validation (types, required, enum, bounds, lengths, patterns), metadata validation (names, labels),
and the field-cause vocabulary Kubernetes uses (``FieldValueRequired``, ``FieldValueInvalid``, …).
Must not do: I/O, or decide resourceVersion/generation (that is the store engine's job).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import BadRequest, Cause, ErrorDetails, Invalid
from ._kinds import KindSpec
from ._rules import has_rules

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# kube-apiserver's wording for a bad name (apimachinery's IsDNS1123Subdomain / IsDNS1123Label).
_DNS_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_DNS_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name' or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_TOP_LEVEL_SKIPPED = ("apiVersion", "kind", "metadata")
_ANNOTATIONS_MAX_BYTES = 256 * 1024


@dataclass
class _Report:
    causes: list[Cause] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    body_root: str = ""  # a status write: kube-apiserver names fields "in body" relative to ``status.``

    def in_body(self, path: str) -> str:
        return path.removeprefix(self.body_root) if self.body_root else path


class _Drop:
    """Marker: the value is pruned from its parent."""


_DROP = _Drop()


def _render(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk(value: Any, schema: Mapping[str, Any], path: str, report: _Report) -> Any:
    if value is None:
        return value if schema.get("nullable") is True else _DROP
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            report.causes.append(
                Cause(
                    "FieldValueTypeInvalid",
                    f"Invalid value: {_render(value)}: must be an integer or a string",
                    path,
                )
            )
        return value
    kind = schema.get("type")
    if isinstance(kind, str) and not _type_ok(value, kind):
        report.causes.append(
            Cause(
                "FieldValueTypeInvalid",
                f'Invalid value: "{_type_name(value)}": {report.in_body(path)} in body must be of type {kind}: '
                f'"{_type_name(value)}"',
                path,
            )
        )
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_render(v) for v in schema["enum"])
        report.causes.append(
            Cause("FieldValueNotSupported", f"Unsupported value: {_render(value)}: supported values: {supported}", path)
        )
    if isinstance(value, dict):
        return _walk_object(value, schema, path, report)
    if isinstance(value, list):
        return _walk_array(value, schema, path, report)
    if isinstance(value, str):
        _check_string(value, schema, path, report)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(value, schema, path, report)
    return value


def _walk_object(value: dict[str, Any], schema: Mapping[str, Any], path: str, report: _Report) -> dict[str, Any]:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    out: dict[str, Any] = {}
    for key, item in value.items():
        item_path = _join(path, key)
        if key in properties:
            result = _walk(item, properties[key], item_path, report)
        elif isinstance(additional, Mapping):
            result = _walk(item, additional, f"{path}[{key}]", report)
        elif preserve or additional is True:
            result = item
        else:
            report.unknown.append(item_path)
            continue
        if not isinstance(result, _Drop):
            out[key] = result
    for key, sub in properties.items():
        if key not in out and isinstance(sub, Mapping) and "default" in sub:
            out[key] = json.loads(json.dumps(sub["default"]))
    for key in schema.get("required") or ():
        if key not in out:
            report.causes.append(Cause("FieldValueRequired", "Required value", _join(path, key)))
    for bound, too_few in (("minProperties", True), ("maxProperties", False)):
        limit = schema.get(bound)
        if isinstance(limit, int) and (len(out) < limit if too_few else len(out) > limit):
            if too_few:
                message = (
                    f"Invalid value: {len(out)}: {report.in_body(path)} in body should have at least {limit} properties"
                )
                report.causes.append(Cause("FieldValueInvalid", message, path))
            else:
                report.causes.append(Cause("FieldValueTooMany", f"Too many: {len(out)}: {_at_most(limit)}", path))
    return out


def _walk_array(value: list[Any], schema: Mapping[str, Any], path: str, report: _Report) -> list[Any]:
    items = schema.get("items")
    out: list[Any] = []
    for index, item in enumerate(value):
        result = _walk(item, items, f"{path}[{index}]", report) if isinstance(items, Mapping) else item
        out.append(None if isinstance(result, _Drop) else result)
    min_items, max_items = schema.get("minItems"), schema.get("maxItems")
    if isinstance(min_items, int) and len(out) < min_items:
        report.causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {len(out)}: {report.in_body(path)} in body should have at least {min_items} items",
                path,
            )
        )
    if isinstance(max_items, int) and len(out) > max_items:
        report.causes.append(Cause("FieldValueTooMany", f"Too many: {len(out)}: {_at_most(max_items)}", path))
    if schema.get("uniqueItems") is True:
        rendered = [json.dumps(item, sort_keys=True) for item in out]
        if len(set(rendered)) != len(rendered):
            report.causes.append(Cause("FieldValueDuplicate", "Duplicate value", path))
    return out


def _check_string(value: str, schema: Mapping[str, Any], path: str, report: _Report) -> None:
    min_length, max_length, pattern = schema.get("minLength"), schema.get("maxLength"), schema.get("pattern")
    if isinstance(min_length, int) and len(value) < min_length:
        report.causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {_render(value)}: {report.in_body(path)} in body "
                f"should be at least {min_length} chars long",
                path,
            )
        )
    if isinstance(max_length, int) and len(value) > max_length:
        unit = "byte" if max_length == 1 else "bytes"
        report.causes.append(
            Cause("FieldValueTooLong", f"Too long: may not be more than {max_length} {unit}", path),
        )
    if isinstance(pattern, str):
        try:
            matched = re.search(pattern, value) is not None
        except re.error:
            matched = True
        if not matched:
            report.causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_render(value)}: {report.in_body(path)} in body should match '{pattern}'",
                    path,
                )
            )


def _check_number(value: float, schema: Mapping[str, Any], path: str, report: _Report) -> None:
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    if isinstance(minimum, int | float):
        exclusive = schema.get("exclusiveMinimum") is True
        if value < minimum or (exclusive and value == minimum):
            word = "greater than" if exclusive else "greater than or equal to"
            report.causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_render(value)}: {report.in_body(path)} in body "
                    f"should be {word} {_number(minimum)}",
                    path,
                )
            )
    if isinstance(maximum, int | float):
        exclusive = schema.get("exclusiveMaximum") is True
        if value > maximum or (exclusive and value == maximum):
            word = "less than" if exclusive else "less than or equal to"
            report.causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: {_render(value)}: {report.in_body(path)} in body "
                    f"should be {word} {_number(maximum)}",
                    path,
                )
            )
    multiple = schema.get("multipleOf")
    if isinstance(multiple, int | float) and multiple and (value / multiple) % 1 != 0:
        report.causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {_render(value)}: {report.in_body(path)} in body "
                f"should be a multiple of {_number(multiple)}",
                path,
            )
        )


# kube-apiserver skips a kind's CEL rules when the object has one of these errors, and says so in one more cause.
_BLOCKING = frozenset(
    {"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany", "FieldValueTypeInvalid"}
)
_RULES_NOT_CHECKED = Cause(
    "FieldValueInvalid",
    "Invalid value: null: some validation rules were not checked because the object was invalid; correct the "
    "existing errors to complete validation",
    "<nil>",
)


def _number(value: float) -> str:
    """A schema bound the way Go's ``%v`` prints a float64: ``1``, not ``1.0``."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _at_most(limit: int) -> str:
    return f"must have at most {limit} {'item' if limit == 1 else 'items'}"


def validate_metadata(spec: KindSpec, metadata: Mapping[str, Any], report_causes: list[Cause]) -> None:
    """Name, labels, annotations and owner references, the way the API server checks them."""
    name = metadata.get("name")
    name_re = _DNS_LABEL if spec.kind == "Namespace" else _DNS_SUBDOMAIN
    if not isinstance(name, str) or not name:
        report_causes.append(
            Cause("FieldValueRequired", "Required value: name or generateName is required", "metadata.name")
        )
    elif len(name) > 253 or not name_re.match(name):
        report_causes.append(
            Cause(
                "FieldValueInvalid",
                f"Invalid value: {_render(name)}: "
                + (_DNS_LABEL_MESSAGE if spec.kind == "Namespace" else _DNS_SUBDOMAIN_MESSAGE),
                "metadata.name",
            )
        )
    labels = metadata.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            report_causes.append(Cause("FieldValueTypeInvalid", "Invalid value: must be a map", "metadata.labels"))
        else:
            for key, value in labels.items():
                if not _qualified_name_ok(key):
                    report_causes.append(
                        Cause(
                            "FieldValueInvalid", f"Invalid value: {_render(key)}: invalid label key", "metadata.labels"
                        )
                    )
                if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                    report_causes.append(
                        Cause(
                            "FieldValueInvalid",
                            f"Invalid value: {_render(value)}: a valid label must be an empty string or consist of "
                            "alphanumeric characters, '-', '_' or '.' (at most 63)",
                            f"metadata.labels[{key}]",
                        )
                    )
    annotations = metadata.get("annotations")
    if annotations is not None:
        if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
            report_causes.append(
                Cause("FieldValueTypeInvalid", "Invalid value: must be a map of strings", "metadata.annotations")
            )
        elif len(json.dumps(annotations)) > _ANNOTATIONS_MAX_BYTES:
            report_causes.append(
                Cause("FieldValueTooLong", "Too long: must have at most 262144 bytes", "metadata.annotations")
            )
    finalizers = metadata.get("finalizers")
    if finalizers is not None and (
        not isinstance(finalizers, list) or not all(isinstance(f, str) and f for f in finalizers)
    ):
        report_causes.append(
            Cause("FieldValueInvalid", "Invalid value: must be a list of non-empty strings", "metadata.finalizers")
        )
    owners = metadata.get("ownerReferences")
    if owners is not None:
        if not isinstance(owners, list):
            report_causes.append(
                Cause("FieldValueTypeInvalid", "Invalid value: must be a list", "metadata.ownerReferences")
            )
        else:
            for index, owner in enumerate(owners):
                for key in ("apiVersion", "kind", "name", "uid"):
                    if not isinstance(owner, dict) or not isinstance(owner.get(key), str) or not owner.get(key):
                        report_causes.append(
                            Cause("FieldValueRequired", "Required value", f"metadata.ownerReferences[{index}].{key}")
                        )


def _qualified_name_ok(key: Any) -> bool:
    if not isinstance(key, str) or not key:
        return False
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def validate_object(
    spec: KindSpec, obj: Mapping[str, Any], *, strict: bool = False, status_write: bool = False
) -> dict[str, Any]:
    """Return a pruned, defaulted copy of ``obj``; raise ``Invalid`` (causes) or ``BadRequest`` (strict).

    ``status_write``: a write through the status subresource (messages name status fields relative to ``status``,
    as kube-apiserver's status validation does)."""
    report = _Report(body_root="status." if status_write else "")
    properties: Mapping[str, Any] = spec.schema.get("properties") or {}
    preserve = spec.schema.get("x-kubernetes-preserve-unknown-fields") is True
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key in _TOP_LEVEL_SKIPPED:
            out[key] = value
        elif key in properties:
            result = _walk(value, properties[key], key, report)
            if not isinstance(result, _Drop):
                out[key] = result
        elif preserve:
            out[key] = value
        else:
            report.unknown.append(key)
    for key, sub in properties.items():
        if key not in out and key not in _TOP_LEVEL_SKIPPED and isinstance(sub, Mapping) and "default" in sub:
            out[key] = json.loads(json.dumps(sub["default"]))
    for key in spec.schema.get("required") or ():
        if key not in out:
            report.causes.append(Cause("FieldValueRequired", "Required value", key))
    metadata = obj.get("metadata")
    validate_metadata(spec, metadata if isinstance(metadata, Mapping) else {}, report.causes)
    name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
    if report.causes:
        if any(c.reason in _BLOCKING for c in report.causes) and has_rules(spec.schema):
            report.causes.append(_RULES_NOT_CHECKED)
        raise invalid_error(spec, str(name), report.causes)
    if strict and report.unknown:
        raise UnknownFields(spec, report.unknown)
    return out


class UnknownFields(BadRequest):
    """Strict field validation found fields the schema does not declare (kube-apiserver's strict decoding error).

    ``fields`` are their paths (``spec.extra``); ``decoding_error`` the text after the kind, which a patch reports
    as a 422 on the ``patch`` field instead (the store does that).
    """

    def __init__(self, spec: KindSpec, fields: list[str]) -> None:
        self.fields = tuple(fields)
        self.decoding_error = "strict decoding error: " + ", ".join(f'unknown field "{path}"' for path in fields)
        super().__init__(
            f'{spec.kind} in version "{spec.version}" cannot be handled as a {spec.kind}: {self.decoding_error}'
        )


def unknown_fields(spec: KindSpec, obj: Mapping[str, Any]) -> list[str]:
    """Paths of the fields in ``obj`` (an object or an object-shaped patch) that the kind's schema does not declare
    — what ``fieldValidation=Warn`` reports in ``Warning`` headers. Never raises."""
    report = _Report()
    properties: Mapping[str, Any] = spec.schema.get("properties") or {}
    preserve = spec.schema.get("x-kubernetes-preserve-unknown-fields") is True
    for key, value in obj.items():
        if key in _TOP_LEVEL_SKIPPED:
            continue
        if key in properties:
            _walk(value, properties[key], key, report)
        elif not preserve:
            report.unknown.append(key)
    return report.unknown


def invalid_error(spec: KindSpec, name: str, causes: list[Cause], *, by_resource: bool = False) -> Invalid:
    """kube-apiserver's 422: ``Kind.group "name" is invalid: …`` (``by_resource``: the resource plural instead of
    the Kind, as the apiserver's own resourceVersion check words it)."""
    group = f".{spec.group}" if spec.group else ""
    kind = spec.plural if by_resource else spec.kind
    errors = [f"{c.field}: {c.message}" for c in causes]
    # kube-apiserver prints one field error bare and several as a bracketed list (a field.ErrorList aggregate).
    summary = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return Invalid(
        f'{kind}{group} "{name}" is invalid: {summary}',
        causes=tuple(causes),
        # Kubernetes names the Kind (not the resource) in Invalid details; kubectl prints it.
        details=ErrorDetails(name=name, group=spec.group, kind=kind),
    )
