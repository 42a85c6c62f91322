"""The versioned stored form of events.

A stored record is ``(kind, v, data)``. ``data`` has one of two forms, told apart by its first byte:

* **JSON** (first byte ``{``): the compact JSON object of the event's fields (without ``kind``). Every kind can
  be stored this way, and every journal written before the compact form holds only this form.
* **Compact** (first byte ``0x01``, then MessagePack): the event's fields as an *array* in the order of its layout
  in `LAYOUTS` (keyed by kind and version), nested values (`Usage`, `ToolCall`, `ToolOutcome`, `QueuedInput`) as
  arrays in the order of `NESTED`. The records a loop writes on every step (model replies, tool outcomes, step
  ends, context measurements, turn starts and ends) use it: no field names, binary numbers, so about 40% fewer
  bytes per step. A kind without a layout, or whose class (or a nested class) no longer has exactly the fields
  its layout names (someone added a field and did not append it to the layout yet), is written as JSON — the
  layouts only ever save bytes, never decide what is stored.

Layouts are positions on disk: **only append** to a layout (a new field goes at its end; a record written before
it has fewer values, and the field takes its default), never reorder, rename or remove an entry. An event whose
version is bumped gets a new ``(kind, v)`` layout, and the old one stays so older records still decode (into the
old version's fields, which the upgrades then carry forward). tests/harness_journal/test_codec.py holds a copy of
the layouts as first written and fails when an entry changed other than by appending.

Reading an older ``v`` runs the registered upgrades in order, so old journals stay readable.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, cast

import ormsgpack
from pydantic import BaseModel, ValidationError

from loopd.harness._errors import HarnessError
from loopd.harness.core._values import ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import ALL_EVENT_TYPES, LoopEvent, QueuedInput, SessionEvent, kind_of

__all__ = ["COMPACT", "LAYOUTS", "NESTED", "CodecError", "StoredEventT", "Upgrade", "decode", "encode"]

StoredEventT: TypeAlias = SessionEvent | LoopEvent
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]

_STORED_TYPES: Mapping[str, type[Any]] = {kind_of(t): t for t in ALL_EVENT_TYPES if t.lifecycle.stored}

COMPACT: Final = 0x01
"""The first byte of a record in the compact form (a JSON record starts with ``{``)."""
_COMPACT_MARK: Final = bytes((COMPACT,))

# A field of a layout: its name, or (name, nested class name, many) for a nested model (many: a tuple of them).
_Field: TypeAlias = str | tuple[str, str, bool]

NESTED: Final[Mapping[str, tuple[str, ...]]] = {
    "Usage": ("input_tokens", "output_tokens", "cached_tokens", "cost_usd", "calls"),
    "ToolCall": ("id", "name", "arguments"),
    "ToolOutcome": ("call_id", "name", "status", "output"),
    "QueuedInput": ("command_id", "text"),
}
"""The stored order of the nested models' fields (append only)."""

_NESTED_TYPES: Final[Mapping[str, type[BaseModel]]] = {
    "Usage": Usage,
    "ToolCall": ToolCall,
    "ToolOutcome": ToolOutcome,
    "QueuedInput": QueuedInput,
}

_USAGE: Final = ("usage", "Usage", False)
_OUTCOMES: Final = ("outcomes", "ToolOutcome", True)

LAYOUTS: Final[Mapping[tuple[str, int], tuple[_Field, ...]]] = {
    ("turn_started", 1): ("loop", "turn_id", ("inputs", "QueuedInput", True), "at"),
    ("input_queued", 1): ("loop", "command_id", "text"),
    ("inputs_folded", 1): ("loop", "turn_id", ("inputs", "QueuedInput", True)),
    ("model_replied", 1): ("loop", "turn_id", "step", "text", ("tool_calls", "ToolCall", True), _USAGE),
    ("tool_completed", 1): ("loop", "turn_id", "step", ("outcome", "ToolOutcome", False)),
    ("step_done", 1): ("loop", "turn_id", "step", _USAGE),
    ("context_measured", 1): ("loop", "turn_id", "step", "tokens", "window", "at"),
    ("turn_done", 1): ("loop", "turn_id", "step", "text", ("step_usage", "Usage", False), _USAGE, "at"),
    ("turn_failed", 1): ("loop", "turn_id", "error_type", "message", _USAGE, _OUTCOMES, "at"),
    ("turn_interrupted", 1): ("loop", "turn_id", "reason", _USAGE, _OUTCOMES, "at"),
}
"""The stored order of each compact kind's fields, by (kind, version) (append only; see the module docstring)."""


class CodecError(HarnessError, ValueError):
    """A record could not be encoded or decoded."""


def _names(layout: tuple[_Field, ...]) -> list[str]:
    return [f if isinstance(f, str) else f[0] for f in layout]


@functools.cache
def _nested_matches(name: str) -> bool:
    """Whether the nested class ``name`` has exactly the fields its stored order names."""
    return set(_NESTED_TYPES[name].model_fields) == set(NESTED[name])


@functools.cache
def _compact_layout(cls: type[Any]) -> tuple[_Field, ...] | None:
    """The layout the current version of ``cls`` is written with, or None (written as JSON): none is registered,
    or the class's fields (or a nested class's) are not exactly those it names."""
    layout = LAYOUTS.get((kind_of(cls), cls.version))
    if layout is None:
        return None
    if set(cls.model_fields) - {"kind"} != set(_names(layout)):
        return None
    if not all(_nested_matches(f[1]) for f in layout if not isinstance(f, str)):
        return None
    return layout


def _pack(event: StoredEventT, layout: tuple[_Field, ...]) -> list[Any]:
    values: list[Any] = []
    for spec in layout:
        if isinstance(spec, str):
            values.append(getattr(event, spec))
            continue
        name, nested, many = spec
        value = getattr(event, name)
        fields = NESTED[nested]
        if value is None:
            values.append(None)
        elif many:
            values.append([[getattr(item, f) for f in fields] for item in value])
        else:
            values.append([getattr(value, f) for f in fields])
    return values


def encode(event: StoredEventT) -> tuple[str, int, bytes]:
    """Return ``(kind, version, data)`` for a stored event (compact when its kind has a layout); refuses
    ephemeral events."""
    if not event.lifecycle.stored:
        raise CodecError(f"ephemeral event {event.kind!r} is never stored")
    layout = _compact_layout(type(event))
    if layout is not None:
        try:
            return event.kind, event.version, _COMPACT_MARK + ormsgpack.packb(_pack(event, layout))
        except TypeError:  # ormsgpack's MsgpackEncodeError
            pass  # a value MessagePack cannot hold (e.g. in a tool's arguments): JSON says what it is
    return event.kind, event.version, event.model_dump_json(exclude={"kind"}).encode()


@functools.cache
def _reader(kind: str, version: int) -> tuple[tuple[str, ...], tuple[tuple[int, str, tuple[str, ...], bool], ...]]:
    """What decoding a compact record of ``(kind, version)`` needs, computed once: the field names by position,
    and the positions holding nested models (position, field, the nested model's field names, many)."""
    layout = LAYOUTS.get((kind, version))
    if layout is None:
        raise CodecError(f"no compact layout for {kind} v{version}")
    nested = tuple((i, f[0], NESTED[f[1]], f[2]) for i, f in enumerate(layout) if not isinstance(f, str))
    return tuple(_names(layout)), nested


def _nested_fields(fields: tuple[str, ...], value: Any) -> dict[str, Any]:
    if type(value) is not list or len(value) > len(fields):
        raise CodecError(f"a stored value of {fields} is not an array of at most {len(fields)} values")
    return dict(zip(fields, value))  # noqa: B905  # shorter is fine (older layout); zip's keyword costs ~0.6 µs


def _unpack(kind: str, version: int, data: bytes) -> dict[str, Any]:
    """The fields of a compact record, by name (the values of the layout's nested models as dicts)."""
    names, nested = _reader(kind, version)
    values = ormsgpack.unpackb(data[1:])  # a copy, yet faster than a memoryview for records this small
    if type(values) is not list or len(values) > len(names):
        raise CodecError(f"{kind} v{version}: not an array of at most {len(names)} values")
    body: dict[str, Any] = dict(zip(names, values))  # noqa: B905  # checked above: at most as many values
    count = len(values)
    for i, name, fields, many in nested:
        if i >= count:
            break
        value = values[i]
        if value is None:
            continue
        if many:
            if type(value) is not list:
                raise CodecError(f"{kind} v{version}: {name} is not an array")
            body[name] = [_nested_fields(fields, item) for item in value]
        else:
            body[name] = _nested_fields(fields, value)
    return body


def decode(
    kind: str, version: int, data: bytes | str, upgrades: Mapping[tuple[str, int], Upgrade] | None = None
) -> StoredEventT:
    """Decode a stored record (either form), upgrading older versions with ``upgrades[(kind, v)]`` (v → v+1)."""
    cls = _STORED_TYPES.get(kind)
    if cls is None:
        raise CodecError(f"unknown event kind {kind!r}")
    current: int = cls.version
    try:
        if version > current:
            raise CodecError(f"{kind} v{version} is newer than this build (v{current})")
        if type(data) is bytes and data and data[0] == COMPACT:
            body: dict[str, Any] = _unpack(kind, version, data)
        elif version == current:
            return cast(StoredEventT, cls.model_validate_json(data))
        else:
            body = json.loads(data)
        for v in range(version, current):
            step = (upgrades or {}).get((kind, v))
            if step is None:
                raise CodecError(f"no upgrade for {kind} v{v} → v{v + 1}")
            body = step(body)
        return cast(StoredEventT, cls.model_validate(body))
    except CodecError:
        raise
    except (ValidationError, ValueError) as exc:  # ValueError: JSON or MessagePack that does not parse
        raise CodecError(f"cannot decode {kind} v{version}: {exc}") from exc
