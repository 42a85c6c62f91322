"""The AgentUE error tree.

    ValueError
     └── AgentUEError                 anything this package refuses
          ├── AgentUEValidationError  the input is not valid AgentUE (model, block, event, frame, SSE message);
          │    │                      fix the producer, retrying the same input fails again
          │    └── AgentUETooDeepError  a JSON value nests deeper than `MAX_DEPTH` (64) objects/arrays; refused
          │                           before anything walks it recursively
          └── AgentUERejectedError    a well-formed event (or one that is not) cannot be applied to this state;
                                      the state is unchanged. `code` says why; NOT_STARTED / ENDED / WRONG_STREAM
                                      usually mean the consumer should resynchronise (reconnect for a new `start`)

Both are `ValueError`s, so an HTTP layer can map the whole family to 400 in one place.
"""

from __future__ import annotations

from enum import StrEnum

from loopd._infra.errors import LoopdError


class AgentUEError(LoopdError, ValueError):
    """Base class of every error raised by `loopd.agentue`."""


class AgentUEValidationError(AgentUEError):
    """Input does not conform to the AgentUE protocol.

    `path` locates the offending value (`model.blocks[1].ref`, `event.mask`, …); `reason` says what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}" if path else reason)


MAX_DEPTH = 64
"""How deeply a JSON value inside AgentUE (a block, `meta`, an event payload, …) may nest objects and arrays.

`{}` and `[]` are depth 1. The limit keeps every recursive walk (copy, clone, reduce) far from Python's recursion
limit, whatever the caller's own stack depth."""


class AgentUETooDeepError(AgentUEValidationError):
    """A JSON value nests objects/arrays deeper than `limit`; `path` names the value that was checked."""

    def __init__(self, path: str, limit: int) -> None:
        self.limit = limit
        super().__init__(path, f"nests objects/arrays more than {limit} levels deep (the limit is {limit})")


class RejectCode(StrEnum):
    """Why the reducer refused an event (machine-readable)."""

    INVALID_EVENT = "invalid_event"
    """The event itself is malformed (the cause is an `AgentUEValidationError`)."""
    WRONG_STREAM = "wrong_stream"
    """The event belongs to another `stream_id` than the state it was applied to."""
    NOT_STARTED = "not_started"
    """The stream has no model yet: every delivery begins with `start`."""
    ENDED = "ended"
    """The stream has ended; only a new `start` (a resumed delivery) reopens it."""
    MISSING_BLOCK = "missing_block"
    """A field patch targets a block that does not exist (and the payload cannot create it)."""
    UNRESOLVED_REFERENCE = "unresolved_reference"
    """A field patch targets a reference block; only a whole-block `set` may replace it."""
    LEGACY_REFERENCE = "legacy_reference"
    """A reference block cannot enter a version 1.0 model."""
    TYPE_MISMATCH = "type_mismatch"
    """`append` found a value of another type than the appended string or array."""
    PATH_CONFLICT = "path_conflict"
    """A dotted path crosses a value that is not an object."""
    INVALID_RESULT = "invalid_result"
    """Applying the event would make the model invalid (for example an empty block `type`)."""


class AgentUERejectedError(AgentUEError):
    """The reducer refused an event; the input state is unchanged."""

    def __init__(self, code: RejectCode, reason: str, *, op: str, seq: int | None, stream_id: str) -> None:
        self.code = code
        self.reason = reason
        self.op = op
        self.seq = seq
        self.stream_id = stream_id
        stream = f"stream {stream_id!r}" if stream_id else "unnamed stream"
        at = f" seq {seq}" if seq is not None else ""
        super().__init__(f"{stream}: {op}{at} rejected ({code.value}): {reason}")
