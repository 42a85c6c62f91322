"""The versioned stored form of events.

A stored record is ``(kind, v, data)`` where ``data`` is the compact JSON of the event's fields (without
``kind``). Reading an older ``v`` runs the registered upgrades in order, so old journals stay readable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, cast

from pydantic import ValidationError

from loopd.harness._errors import HarnessError
from loopd.harness.core.events import ALL_EVENT_TYPES, LoopEvent, SessionEvent, kind_of

StoredEventT: TypeAlias = SessionEvent | LoopEvent
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]

_STORED_TYPES: Mapping[str, type[Any]] = {kind_of(t): t for t in ALL_EVENT_TYPES if t.lifecycle.stored}


class CodecError(HarnessError, ValueError):
    """A record could not be encoded or decoded."""


def encode(event: StoredEventT) -> tuple[str, int, bytes]:
    """Return ``(kind, version, data)`` for a stored event; refuses ephemeral events."""
    if not event.lifecycle.stored:
        raise CodecError(f"ephemeral event {event.kind!r} is never stored")
    return event.kind, event.version, event.model_dump_json(exclude={"kind"}).encode()


def decode(
    kind: str, version: int, data: bytes | str, upgrades: Mapping[tuple[str, int], Upgrade] | None = None
) -> StoredEventT:
    """Decode a stored record, upgrading older versions with ``upgrades[(kind, v)]`` (v → v+1)."""
    cls = _STORED_TYPES.get(kind)
    if cls is None:
        raise CodecError(f"unknown event kind {kind!r}")
    current: int = cls.version
    try:
        if version == current:
            return cast(StoredEventT, cls.model_validate_json(data))
        if version > current:
            raise CodecError(f"{kind} v{version} is newer than this build (v{current})")
        body: dict[str, Any] = json.loads(data)
        for v in range(version, current):
            step = (upgrades or {}).get((kind, v))
            if step is None:
                raise CodecError(f"no upgrade for {kind} v{v} → v{v + 1}")
            body = step(body)
        return cast(StoredEventT, cls.model_validate(body))
    except (ValidationError, json.JSONDecodeError) as exc:
        raise CodecError(f"cannot decode {kind} v{version}: {exc}") from exc
