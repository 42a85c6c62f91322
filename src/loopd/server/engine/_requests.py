"""What callers hand the engine: `CallRequest`, its validation, and what of it makes a call's identity.

A call's identity is (``owner_uid``, ``effect_key``); everything else that shapes the execution is a parameter
(the fingerprint): target, text, history, params, asker, timeout, the visible destination, and the workspace and
tools profile when given. Same identity + same parameters is the same call; different parameters are a
``Conflict``. Must not do: I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from loopd.harness.standard import TOOLS_PROFILES, ToolsProfile, WorkspaceLocationError, check_workspace_location
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
    workspace: str | None = None
    """The call's own workspace: a location relative to the engine's workspaces root (the HTTP route prefixes the
    caller's ``<kind>/<key>``), created on demand. None: the target's own workspace."""
    fork: tuple[str, int] | None = None
    """Start the call's harness session as a fork of session ``fork[0]`` at journal seq ``fork[1]`` (a settled
    point), so it answers from that harness state. Set by loop-server itself (retrying from a message), never
    taken from a client: the adapter must be `ForkCapable`."""
    tools: ToolsProfile | None = None
    """The tools profile (``none`` | ``read`` | ``write``) with its unattended gate policy; read/write need a
    ``workspace``. None: the target's own tools and gates (``read`` when a workspace is given)."""

    @property
    def profile(self) -> ToolsProfile | None:
        """The tools profile the call runs with: ``tools``, else ``read`` with a workspace, else None."""
        if self.tools is not None:
            return self.tools
        return "read" if self.workspace is not None else None

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
        if self.workspace is not None:
            try:
                check_workspace_location(self.workspace)
            except WorkspaceLocationError as exc:
                raise InvalidRecord(str(exc)) from exc
        if self.tools is not None and self.tools not in TOOLS_PROFILES:
            raise InvalidRecord(f"tools must be one of {', '.join(TOOLS_PROFILES)}, not {self.tools!r}")
        if self.tools in ("read", "write") and self.workspace is None:
            raise InvalidRecord(f"tools {self.tools!r} need a workspace (the call's own directory)")
        if self.fork is not None:
            session, seq = self.fork
            if not isinstance(session, str) or not session or len(session) > 500:
                raise InvalidRecord("fork names a harness session id (a non-empty string)")
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
                raise InvalidRecord("fork's seq must be a journal seq (1 or more)")
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
        """What the call row keeps and the fingerprint covers (with ``target``). ``workspace`` and ``tools`` are
        there only when the call has them, so the calls stored before they existed keep their fingerprints."""
        stored: dict[str, Any] = {
            "text": self.text,
            "history": [entry.to_json() for entry in self.history],
            "params": dict(self.params),
            "asker": self.asker,
            "timeout": float(self.timeout),
            "conversation_id": self.conversation_id,
            "message_id": self.message_id,
        }
        if self.workspace is not None:
            stored["workspace"] = self.workspace
        if self.profile is not None:
            stored["tools"] = self.profile
        if self.fork is not None:
            stored["fork"] = {"session": self.fork[0], "seq": self.fork[1]}
        return stored


def history_of(params: Mapping[str, Any]) -> tuple[HistoryEntry, ...]:
    """The history stored in a call's params."""
    entries = params.get("history") or []
    return tuple(
        HistoryEntry(str(entry.get("kind", "")), str(entry.get("key", "")), str(entry.get("text", "")))
        for entry in entries
        if isinstance(entry, Mapping)
    )


def fork_of(params: Mapping[str, Any]) -> tuple[str, int] | None:
    """The fork point (harness session id, seq) stored in a call's params, or None."""
    fork = params.get("fork")
    if not isinstance(fork, Mapping):
        return None
    session, seq = fork.get("session"), fork.get("seq")
    if isinstance(session, str) and isinstance(seq, int) and not isinstance(seq, bool):
        return session, seq
    return None


def workspace_of(params: Mapping[str, Any]) -> tuple[str | None, ToolsProfile | None]:
    """The workspace location and tools profile stored in a call's params (None, None: the target's own)."""
    workspace = params.get("workspace")
    tools = params.get("tools")
    return (
        workspace if isinstance(workspace, str) else None,
        cast(ToolsProfile, tools) if tools in TOOLS_PROFILES else None,
    )
