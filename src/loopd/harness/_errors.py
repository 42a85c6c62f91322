"""The harness exception tree (the harness's branch of ``loopd._infra.errors.LoopdError``).

    HarnessError
    ├── SessionClosedError          the session was shut down (by you)
    ├── SessionFaultError           the session stopped because something broke (e.g. a journal append)
    ├── SessionNotFoundError        restore of an unknown session id (a NotFoundError)
    ├── SessionBusyError            a writer already owns this session
    ├── ForkPointError              a fork asked for a seq past the journal's end or inside a turn (a ValueError)
    ├── ForkWorkspaceError          a fork's workspace cannot be restored from a snapshot as asked (a ValueError)
    ├── MailboxFullError            a command could not be queued in time (back-pressure)
    ├── SubscriptionLostError       a subscriber fell behind on enduring events; resubscribe from `last_seq`
    ├── ConfigurationDriftError     a restore refused: the rig's configuration differs from the session's (a Conflict)
    ├── UnknownSettingError         a mode, model or loop name the rig does not declare (a ValueError)
    ├── NoSuchQuestionError         an answer to an ask_user question that is not open (a NotFoundError)
    ├── HustleQueueFullError        a background lane is full (``runtime``); the hustle was not started
    ├── BudgetExceeded              the session spent its token or USD budget; the turn fails with this type
    ├── InvalidTransitionError      an event cannot follow the state before it (a tool result outside a turn …);
    │                               replayed from a journal it means corruption (→ JournalCorruptError)
    ├── CodecError                  an event could not be encoded or decoded (``core.codec``; also a ValueError)
    ├── JournalError
    │   ├── JournalFencedError      another writer took over the session
    │   ├── JournalCorruptError     stored records cannot be replayed: out of seq order, an unknown kind, an
    │   │                           undecodable payload, an event that cannot follow the state before it
    │   └── SnapshotSeqError        a state snapshot offered for a seq the journal does not hold (a ValueError)
    ├── SnapshotDecodeError         a stored state snapshot does not decode (``core.snapshot``; ignored, replayed)
    ├── ModelError                  provider failure; `retryable` says whether a retry may succeed
    │   ├── ModelRetryableError     (an UnavailableError)
    │   └── ModelPermanentError
    ├── PriceTableError             the price table cannot be read (``models``; also a ValueError)
    ├── ToolError                   a tool refused or failed its call (reported to the model, not raised to users)
    │   └── ToolArgumentsError      arguments failed validation in `prepare`
    │       └── WorkspaceEscapeError  a path leaves the workspace (``tools``)
    ├── SandboxError                the sandbox cannot run a command (``tools``; SandboxUnavailableError)
    ├── McpConnectError             an MCP server cannot be reached (``tools``)
    ├── DelegationError             a sub-agent cannot be started or reached (``runtime``)
    ├── GateError                   the gate; callers fail closed (see ``loopd.harness.gate._errors``)
    └── the transport's (``serve``): IdempotencyStoreError, InsecureBindError (also a ValueError)

Foreign exceptions are translated at the boundary with ``raise Ours(...) from exc``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from loopd._infra.errors import ConflictError, LoopdError, NotFoundError, UnavailableError


class HarnessError(LoopdError):
    """Base of every error the harness raises on purpose."""


class SessionClosedError(HarnessError):
    """The session was closed (shutdown); it accepts no further commands."""


class SessionFaultError(HarnessError):
    """The session stopped because of a fault from outside (fail-closed)."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} stopped: {reason}")
        self.session_id = session_id
        self.reason = reason


class SessionNotFoundError(HarnessError, NotFoundError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r} in the journal")
        self.session_id = session_id


class SessionBusyError(HarnessError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already has a live writer")
        self.session_id = session_id


class ForkPointError(HarnessError, ValueError):
    """A session cannot be forked at this seq: it is past the parent's last record, below 1, or inside a turn.

    ``settled`` is the last settled seq at or before the one asked for (every loop idle there), when there is one.
    """

    def __init__(self, message: str, *, settled: int | None = None) -> None:
        super().__init__(message)
        self.settled = settled


class ForkWorkspaceError(HarnessError, ValueError):
    """A fork's workspace cannot be put back to the parent's snapshot as asked: the rig takes no snapshots, the
    parent has none at or before the fork point, or the fork's own directory is not empty."""


class MailboxFullError(HarnessError):
    """A command could not be queued before its deadline."""


class BudgetExceeded(HarnessError):
    """A session's token or USD budget is spent. The turn that needed another model call fails with this type."""

    def __init__(self, limit: str, allowed: float, used: float) -> None:
        unit = "USD" if limit == "usd" else "tokens"
        shown_used = f"{used:.4f}" if limit == "usd" else f"{int(used)}"
        shown_allowed = f"{allowed:.4f}" if limit == "usd" else f"{int(allowed)}"
        super().__init__(f"the session's {unit} budget is spent: used {shown_used} of {shown_allowed} {unit}")
        self.limit = limit
        self.allowed = allowed
        self.used = used


class SubscriptionLostError(HarnessError):
    """The subscriber's queue overflowed with an enduring event.

    Nothing enduring is lost for good: resubscribe with ``from_seq=last_seq + 1`` to catch up from the journal.
    """

    def __init__(self, last_seq: int) -> None:
        super().__init__(f"subscription lost after journal seq {last_seq}; resubscribe from {last_seq + 1}")
        self.last_seq = last_seq


class InvalidTransitionError(HarnessError):
    """An event cannot follow the state it was applied to (e.g. a tool result outside a turn).

    Live, it would be a bug of `decide`; replayed from a journal, the stored records are corrupt (restore raises
    `JournalCorruptError` from it)."""


class JournalError(HarnessError):
    """The journal could not store or read records."""


class JournalFencedError(JournalError):
    """Another writer owns the session now; this writer must stop."""


class JournalCorruptError(JournalError):
    """Stored records cannot be replayed: a seq out of order, an unknown kind, an undecodable payload, or an event
    that cannot follow the state before it. The cause (``CodecError``, ``InvalidTransitionError``) is chained."""


class SnapshotSeqError(JournalError, ValueError):
    """A state snapshot was offered for a seq the session's journal does not hold."""


class ModelError(HarnessError):
    """A model provider failed."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ModelRetryableError(ModelError, UnavailableError):
    """Rate limits, timeouts, 5xx, dropped connections: a retry may succeed."""

    retryable = True

    def __init__(self, message: str, *, status_code: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.retry_after = retry_after


class ModelPermanentError(ModelError):
    """Bad request, auth, unknown model: retrying will not help."""

    retryable = False


class ToolError(HarnessError):
    """A tool failed or refused; the message goes back to the model as the tool's output."""


class ToolArgumentsError(ToolError):
    """The model's arguments failed validation."""


class ConfigurationDriftError(HarnessError, ConflictError):
    """A restore found the rig's configuration changed and its drift policy refused; ``changes`` say what differs."""

    def __init__(self, session_id: str, changes: tuple[Any, ...]) -> None:
        shown = "; ".join(f"{c.aspect}: {c.before or '(none)'} → {c.after or '(none)'}" for c in changes)
        super().__init__(
            f"session {session_id} was started under another configuration ({shown}); "
            "restore it with the rig it was started with, or with a drift policy that adopts changes"
        )
        self.session_id = session_id
        self.changes = changes


class UnknownSettingError(HarnessError, ValueError):
    """A command names a mode, model or loop that the rig does not declare."""


class NoSuchQuestionError(HarnessError, NotFoundError):
    """No open ask_user question has this id (never asked, already answered, or past its deadline)."""
