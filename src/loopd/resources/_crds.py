"""Validate ``apiextensions.k8s.io/v1`` CustomResourceDefinition objects and derive their ``KindSpec``s.

Owns: the CRD shape rules (names, scope, versions, structural schema, printer columns) reported as field causes.
Must not do: I/O or registry mutation (the store decides when a CRD takes effect).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._errors import Cause, ErrorDetails, Invalid
from ._kinds import KindSpec, PrinterColumn
from ._rules import check_rules

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KIND_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_VERSION = re.compile(r"^v[0-9]+((alpha|beta)[0-9]+)?$")
_COLUMN_TYPES = {"integer", "number", "string", "boolean", "date"}
_SCHEMA_TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def _required(causes: list[Cause], field: str) -> None:
    causes.append(Cause("FieldValueRequired", "Required value", field))


def _invalid(causes: list[Cause], field: str, value: Any, why: str) -> None:
    causes.append(Cause("FieldValueInvalid", f"Invalid value: {value!r}: {why}", field))


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


def _check_schema(schema: Any, path: str, causes: list[Cause], *, reachable: bool = False, root: bool = False) -> None:
    """A light structural-schema check: every node has a known type or preserves unknown fields; validation rules
    are of the subset the embedded API evaluates (``_rules``), at nodes it evaluates them (``reachable``: reached
    from the root through ``properties`` only; the root itself is not)."""
    if not isinstance(schema, Mapping):
        _invalid(causes, path, schema, "must be an object")
        return
    check_rules(schema, path, causes, reachable=reachable)
    kind = schema.get("type")
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields") is True or schema.get("x-kubernetes-int-or-string")
    if kind is None and not open_ended:
        _required(causes, f"{path}.type")
    elif kind is not None and kind not in _SCHEMA_TYPES:
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f'Unsupported value: {kind!r}: supported values: "{", ".join(sorted(_SCHEMA_TYPES))}"',
                f"{path}.type",
            )
        )
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            _check_schema(sub, f"{path}.properties[{name}]", causes, reachable=reachable or root)
    items = schema.get("items")
    if items is not None:
        _check_schema(items, f"{path}.items", causes)
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        _check_schema(additional, f"{path}.additionalProperties", causes)


def kind_specs_from_crd(crd: Mapping[str, Any]) -> list[KindSpec]:
    """Validate a CRD object and return one ``KindSpec`` per served version; raise ``Invalid`` otherwise."""
    causes: list[Cause] = []
    metadata_raw = crd.get("metadata")
    metadata: Mapping[str, Any] = metadata_raw if isinstance(metadata_raw, Mapping) else {}
    spec_raw = crd.get("spec")
    spec: Mapping[str, Any] = spec_raw if isinstance(spec_raw, Mapping) else {}
    if not isinstance(spec_raw, Mapping):
        _required(causes, "spec")
    group = _str(spec, "group")
    if not group:
        _required(causes, "spec.group")
    elif "." not in group or not all(_DNS_LABEL.match(part) for part in group.split(".")):
        _invalid(causes, "spec.group", group, "should be a domain with at least one dot")
    names_raw = spec.get("names")
    names: Mapping[str, Any] = names_raw if isinstance(names_raw, Mapping) else {}
    plural = _str(names, "plural")
    kind = _str(names, "kind")
    if not plural:
        _required(causes, "spec.names.plural")
    elif not _DNS_LABEL.match(plural):
        _invalid(causes, "spec.names.plural", plural, "must be a lowercase DNS label")
    if not kind:
        _required(causes, "spec.names.kind")
    elif not _KIND_NAME.match(kind):
        _invalid(causes, "spec.names.kind", kind, "must be a CamelCase name")
    singular = _str(names, "singular") or kind.lower()
    name = _str(metadata, "name")
    if plural and group and name != f"{plural}.{group}":
        _invalid(causes, "metadata.name", name, f'must be spec.names.plural+"."+spec.group: "{plural}.{group}"')
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        causes.append(
            Cause(
                "FieldValueNotSupported" if scope else "FieldValueRequired",
                f'Unsupported value: {scope!r}: supported values: "Cluster", "Namespaced"'
                if scope
                else "Required value",
                "spec.scope",
            )
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        _required(causes, "spec.versions")
        versions = []
    storage_count = 0
    specs: list[KindSpec] = []
    for index, version in enumerate(versions):
        path = f"spec.versions[{index}]"
        if not isinstance(version, Mapping):
            _invalid(causes, path, version, "must be an object")
            continue
        version_name = _str(version, "name")
        if not version_name:
            _required(causes, f"{path}.name")
        elif not _VERSION.match(version_name):
            _invalid(causes, f"{path}.name", version_name, "must look like v1, v1beta1 or v1alpha1")
        if version.get("storage") is True:
            storage_count += 1
        schema_wrapper = version.get("schema")
        schema = schema_wrapper.get("openAPIV3Schema") if isinstance(schema_wrapper, Mapping) else None
        if schema is None:
            _required(causes, f"{path}.schema.openAPIV3Schema")
        else:
            _check_schema(schema, f"{path}.schema.openAPIV3Schema", causes, root=True)
        columns = _printer_columns(version.get("additionalPrinterColumns"), path, causes)
        subresources = version.get("subresources")
        has_status = isinstance(subresources, Mapping) and "status" in subresources
        if version.get("served") is True and isinstance(schema, Mapping):
            specs.append(
                KindSpec(
                    group=group,
                    version=version_name,
                    kind=kind,
                    plural=plural,
                    singular=singular,
                    namespaced=scope == "Namespaced",
                    status_subresource=has_status,
                    short_names=tuple(str(s) for s in names.get("shortNames") or ()),
                    categories=tuple(str(c) for c in names.get("categories") or ()),
                    schema=dict(schema),
                    printer_columns=columns,
                    list_kind=_str(names, "listKind"),
                )
            )
    if versions and storage_count != 1:
        _invalid(causes, "spec.versions", storage_count, "must have exactly one version marked as storage version")
    if causes:
        raise Invalid(
            f'CustomResourceDefinition.apiextensions.k8s.io "{name}" is invalid: '
            + ", ".join(f"{c.field}: {c.message}" for c in causes),
            causes=tuple(causes),
            details=ErrorDetails(name=name, group="apiextensions.k8s.io", kind="CustomResourceDefinition"),
        )
    return specs


def _printer_columns(raw: Any, path: str, causes: list[Cause]) -> tuple[PrinterColumn, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        _invalid(causes, f"{path}.additionalPrinterColumns", raw, "must be a list")
        return ()
    columns: list[PrinterColumn] = []
    for index, column in enumerate(raw):
        column_path = f"{path}.additionalPrinterColumns[{index}]"
        if not isinstance(column, Mapping):
            _invalid(causes, column_path, column, "must be an object")
            continue
        name, kind, json_path = _str(column, "name"), _str(column, "type"), _str(column, "jsonPath")
        if not name:
            _required(causes, f"{column_path}.name")
        if kind not in _COLUMN_TYPES:
            _invalid(causes, f"{column_path}.type", kind, "must be one of " + ", ".join(sorted(_COLUMN_TYPES)))
        if not json_path:
            _required(causes, f"{column_path}.jsonPath")
        priority = column.get("priority", 0)
        columns.append(
            PrinterColumn(
                name=name,
                type=kind,
                json_path=json_path,
                description=_str(column, "description"),
                priority=priority if isinstance(priority, int) else 0,
                format=_str(column, "format"),
            )
        )
    return tuple(columns)
