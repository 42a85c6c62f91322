"""JSON values: checked deep copies, cheap clones and dotted paths. Pure.

Every JSON value that enters an AgentUE object is copied (and checked) once, so a model or event never shares a
mutable dict or list with its caller; everything handed out again is a clone. Its depth is checked first, without
recursion, so the recursive copy and every later clone stay within `MAX_DEPTH` levels. Between states the reducer shares
untouched values freely, which is safe because nothing here mutates a value after construction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from loopd._infra.errors import LoopdError
from loopd._infra.jsontext import compact
from loopd.agentue._errors import MAX_DEPTH, AgentUETooDeepError, AgentUEValidationError

JsonObject = dict[str, Any]


class _NotJson(LoopdError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.trail: list[str] = []


def _checked(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(f"{value!r} is not a JSON number")
        return value
    if isinstance(value, dict):
        out: JsonObject = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NotJson(f"object key {key!r} is not a string")
            try:
                out[key] = _checked(item)
            except _NotJson as exc:
                exc.trail.append(f".{key}")
                raise
        return out
    if isinstance(value, list):
        items: list[Any] = []
        for index, item in enumerate(value):
            try:
                items.append(_checked(item))
            except _NotJson as exc:
                exc.trail.append(f"[{index}]")
                raise
        return items
    raise _NotJson(f"{type(value).__name__} is not a JSON value")


def check_depth(value: Any, path: str, limit: int = MAX_DEPTH) -> None:
    """Raise `AgentUETooDeepError` when `value` nests dicts/lists (or other mappings/sequences that are not
    strings) more than `limit` levels deep. Iterative: any depth is measured without recursion."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        if depth > limit:
            raise AgentUETooDeepError(path, limit)
        pending.extend((child, depth + 1) for child in children if isinstance(child, Mapping | list | tuple))


def checked_copy(value: Any, path: str) -> Any:
    """A deep copy of `value`, which must be plain JSON (dict with str keys, list, str, int, finite float, bool,
    None) nested at most `MAX_DEPTH` levels; anything else raises `AgentUEValidationError` (`AgentUETooDeepError`
    for the depth) naming the offending path."""
    check_depth(value, path)
    try:
        return _checked(value)
    except _NotJson as exc:
        raise AgentUEValidationError(path + "".join(reversed(exc.trail)), exc.reason) from None


def checked_object(value: Any, path: str) -> JsonObject:
    """`checked_copy` of a value that must be a JSON object (any `Mapping` is accepted and copied)."""
    if not isinstance(value, Mapping):
        raise AgentUEValidationError(path, f"must be a JSON object, not {describe(value)}")
    copied: JsonObject = checked_copy(dict(value), path)
    return copied


def clone(value: Any) -> Any:
    """A deep copy of a value that is already known to be plain JSON."""
    if isinstance(value, dict):
        return {key: clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clone(item) for item in value]
    return value


def describe(value: Any) -> str:
    """A short JSON-ish type name for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if value == "" else "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def is_nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def require_nonempty_str(obj: Mapping[str, Any], key: str, path: str) -> None:
    """`obj[key]` must be present and a non-empty string."""
    if key not in obj:
        raise AgentUEValidationError(f"{path}.{key}", "is required (a non-empty string)")
    if not is_nonempty_str(obj[key]):
        raise AgentUEValidationError(f"{path}.{key}", f"must be a non-empty string, not {describe(obj[key])}")


def split_path(path: Any, where: str) -> tuple[str, ...]:
    """Split a dotted mask such as `block.tool.status`; every segment must be non-empty."""
    if not isinstance(path, str) or not path:
        raise AgentUEValidationError(where, f"must be a non-empty dotted path, not {describe(path)}")
    segments = tuple(path.split("."))
    if any(segment == "" for segment in segments):
        raise AgentUEValidationError(where, f"{path!r} has an empty segment")
    return segments


def get_path(obj: Mapping[str, Any], segments: Sequence[str]) -> tuple[bool, Any]:
    """(found, value) at a dotted path; a non-object on the way means "not found"."""
    current: Any = obj
    for segment in segments:
        if not isinstance(current, dict) or segment not in current:
            return False, None
        current = current[segment]
    return True, current


def read_patch_value(payload: Mapping[str, Any], segments: Sequence[str]) -> tuple[bool, Any]:
    """The value a field patch carries for `segments`: at the same path in the payload, else under a flat key
    named after the last segment. `null` is a real value."""
    found, value = get_path(payload, segments)
    if found:
        return True, value
    if segments[-1] in payload:
        return True, payload[segments[-1]]
    return False, None


class PathConflict(LoopdError):
    """A dotted path crosses a value that is not an object (internal; the reducer turns it into a rejection)."""

    def __init__(self, prefix: str, found: Any) -> None:
        self.prefix = prefix
        super().__init__(f"{prefix!r} is {describe(found)}, not an object")


def set_path(obj: Mapping[str, Any], segments: Sequence[str], value: Any) -> JsonObject:
    """A copy of `obj` with `value` written at the path; missing intermediate objects are created, the objects on
    the path are copied (copy on write) and everything else is shared. Raises `PathConflict` when an intermediate
    value exists but is not an object (including `null`)."""
    out = dict(obj)
    node = out
    for depth, segment in enumerate(segments[:-1]):
        child = node.get(segment, {})
        if not isinstance(child, dict):
            raise PathConflict(".".join(segments[: depth + 1]), child)
        child = dict(child)
        node[segment] = child
        node = child
    node[segments[-1]] = value
    return out


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON text (no NaN/Infinity, no ASCII escaping)."""
    return compact(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str, path: str) -> Any:
    """Parse JSON text strictly (NaN and Infinity are refused)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        # The parser itself recurses per level; text this deep is far past MAX_DEPTH anyway.
        raise AgentUETooDeepError(path, MAX_DEPTH) from None
    except ValueError as exc:
        raise AgentUEValidationError(path, f"invalid JSON: {exc}") from exc
