"""``meta.k8s.io/v1`` Table rendering for ``kubectl get`` (printer columns, ages, row objects).

Owns: the printer-column JSONPath subset (``.a.b``, ``[n]``, ``[?(@.k=="v")]``), cell typing, human durations
and Table / row assembly. Must not do: I/O or request parsing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from ._kinds import KindSpec, PrinterColumn

IncludeObject = Literal["None", "Metadata", "Object"]

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}
_STEP = re.compile(r"""\.([A-Za-z0-9_\-/]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_\-.]+)\s*==\s*["']([^"']*)["']\)\]""")


def _path_steps(path: str) -> list[tuple[str, Any, Any]]:
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    steps: list[tuple[str, Any, Any]] = []
    position = 0
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            return []
        if match.group(1) is not None:
            steps.append(("key", match.group(1), None))
        elif match.group(2) is not None:
            steps.append(("index", int(match.group(2)), None))
        else:
            steps.append(("filter", match.group(3), match.group(4)))
        position = match.end()
    return steps


def evaluate_path(obj: Any, path: str) -> Any:
    """Resolve a printer-column JSONPath; ``None`` when any step is missing."""
    current = obj
    for kind, first, second in _path_steps(path):
        if kind == "key":
            current = current.get(first) if isinstance(current, Mapping) else None
        elif kind == "index":
            current = current[first] if isinstance(current, list) and first < len(current) else None
        else:
            matches = [
                item
                for item in (current if isinstance(current, list) else [])
                if isinstance(item, Mapping) and str(evaluate_path(item, "." + first)) == second
            ]
            current = matches[0] if matches else None
        if current is None:
            return None
    return current


def human_duration(seconds: float) -> str:
    """Kubernetes' ``duration.HumanDuration``."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def _served_versions(crd: Mapping[str, Any]) -> str:
    spec = crd.get("spec") or {}
    labels = [
        f"{v.get('name')}(storage)" if v.get("storage") else str(v.get("name"))
        for v in spec.get("versions") or ()
        if isinstance(v, Mapping) and v.get("served")
    ]
    return ",".join(sorted(labels))


def _short_names(crd: Mapping[str, Any]) -> str:
    names = (crd.get("spec") or {}).get("names") or {}
    return ",".join(str(n) for n in names.get("shortNames") or ())


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or ()
    return any(
        isinstance(c, Mapping) and c.get("type") == "Established" and c.get("status") == "True" for c in conditions
    )


COMPUTED_CELLS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "@servedVersions": _served_versions,
    "@shortNames": _short_names,
    "@established": _established,
}
"""Cells no JSONPath expresses, by pseudo-path: the columns kube-apiserver prints for CustomResourceDefinitions."""


def _cell(column: PrinterColumn, obj: Mapping[str, Any], now: datetime) -> Any:
    computed = COMPUTED_CELLS.get(column.json_path)
    if computed is not None:
        return computed(obj)
    value = evaluate_path(obj, column.json_path)
    if value is None:
        return None
    if column.type == "date" and isinstance(value, str):
        try:
            then = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return human_duration((now - then).total_seconds())
    if column.type == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if column.type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if column.type == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value) if column.type in ("string", "date") else value


def column_definitions(spec: KindSpec) -> list[dict[str, Any]]:
    columns = [dict(_NAME_COLUMN)]
    for column in spec.printer_columns:
        columns.append(
            {
                "name": column.name,
                "type": "string" if column.type == "date" else column.type,
                "format": column.format,
                "description": column.description,
                "priority": column.priority,
            }
        )
    return columns


def table_row(spec: KindSpec, obj: Mapping[str, Any], include: IncludeObject, now: datetime) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    cells = [metadata.get("name", "")]
    cells.extend(_cell(column, obj, now) for column in spec.printer_columns)
    row: dict[str, Any] = {"cells": cells}
    if include == "Object":
        row["object"] = dict(obj)
    elif include == "Metadata":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}
    return row


def table(
    spec: KindSpec,
    objects: Iterable[Mapping[str, Any]],
    *,
    resource_version: str,
    include: IncludeObject = "Metadata",
    with_columns: bool = True,
    continue_token: str | None = None,
    now: datetime,
) -> dict[str, Any]:
    moment = now
    meta: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        meta["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": column_definitions(spec) if with_columns else None,
        "rows": [table_row(spec, obj, include, moment) for obj in objects],
    }
