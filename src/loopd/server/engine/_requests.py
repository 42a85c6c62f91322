"""What callers hand the engine: `CallRequest`, its validation, and what of it makes a call's identity.

A call's identity is (``owner_uid``, ``effect_key``); everything else that shapes the execution is a parameter
(the fingerprint): target, text, history, params, asker, timeout and the visible destination. Same identity +
same parameters is the same call; different parameters are a ``Conflict``. Must not do: I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from loopd.server.storage import InvalidRecord, canonical_json

from ._adapter import HistoryEntry

DEFAULT_TIMEOUT: Final = 1800.0
MAX_TIMEOUT: Final = 7 * 24 * 3600.0
MAX_TEXT: Final = 200_000
MAX_HISTORY: Final = 200
MAX_PARAMS_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class CallRequest:
    """Start (or re-attach to) the harness call (``owner_uid``, ``effect_key``).

    ``message_id`` names the streaming message the call's visible output goes to (e.g. a Task's response);
    without it the engine opens a new ``output`` message (kind harness, key = target) in ``conversation_id``
    in the same transaction as the call. ``asker`` (``user:<key>``) is the only identity that may answer the
    call's gates. ``timeout`` is finite; the deadline is fixed when the call is first stored.
    """

    owner_uid: str
    effect_key: str
    target: str
    text: str
    conversation_id: str | None = None
    message_id: str | None = None
    history: Sequence[HistoryEntry] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    asker: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    task_id: str | None = None
    """For an output message the engine opens: its task (defaults to the conversation's task)."""

    def validate(self, *, max_timeout: float = MAX_TIMEOUT) -> None:
        """Raise ``InvalidRecord`` for anything malformed."""
        for name in ("owner_uid", "effect_key", "target"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip() or len(value) > 500:
                raise InvalidRecord(f"{name} must be a non-empty string of at most 500 characters")
        if not isinstance(self.text, str) or not self.text.strip() or len(self.text) > MAX_TEXT:
            raise InvalidRecord(f"text must be a non-empty string of at most {MAX_TEXT} characters")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
            raise InvalidRecord("timeout must be a finite number of seconds")
        if not 0 < timeout <= max_timeout:
            raise InvalidRecord(f"timeout must be more than 0 and at most {max_timeout:g} seconds")
        if self.message_id is None and self.conversation_id is None:
            raise InvalidRecord("a call needs a message_id, or a conversation_id to open its output message in")
        for name in ("conversation_id", "message_id", "asker", "task_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRecord(f"{name} must be a non-empty string when given")
        if len(self.history) > MAX_HISTORY:
            raise InvalidRecord(f"history holds at most {MAX_HISTORY} entries")
        for entry in self.history:
            if not isinstance(entry, HistoryEntry) or not all(
                isinstance(v, str) for v in (entry.kind, entry.key, entry.text)
            ):
                raise InvalidRecord("history entries are HistoryEntry(kind, key, text) with string fields")
        if not isinstance(self.params, Mapping):
            raise InvalidRecord("params must be an object")
        if len(canonical_json(dict(self.params))) > MAX_PARAMS_BYTES:
            raise InvalidRecord(f"params must be at most {MAX_PARAMS_BYTES} bytes of JSON")

    def stored_params(self) -> dict[str, Any]:
        """What the call row keeps and the fingerprint covers (with ``target``)."""
        return {
            "text": self.text,
            "history": [entry.to_json() for entry in self.history],
            "params": dict(self.params),
            "asker": self.asker,
            "timeout": float(self.timeout),
            "conversation_id": self.conversation_id,
            "message_id": self.message_id,
        }


def history_of(params: Mapping[str, Any]) -> tuple[HistoryEntry, ...]:
    """The history stored in a call's params."""
    entries = params.get("history") or []
    return tuple(
        HistoryEntry(str(entry.get("kind", "")), str(entry.get("key", "")), str(entry.get("text", "")))
        for entry in entries
        if isinstance(entry, Mapping)
    )
