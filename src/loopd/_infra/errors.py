"""The root of every exception loopd raises on purpose, and the few markers shared across layers.

Each layer owns one subtree and draws its detail where it is defined; this is the whole tree in one place::

    LoopdError                   .retryable: may the same request succeed later, unchanged?
    │  markers, mixed into the layer classes below (no state of their own):
    ├── NotFoundError            the addressed thing does not exist
    ├── ConflictError            the thing exists in a state that contradicts the request
    ├── UnavailableError         a dependency cannot answer now (database, store, provider); retryable
    │
    ├── AgentUEError             loopd.agentue (also a ValueError): invalid AgentUE, a rejected event
    ├── HarnessError             loopd.harness: sessions, InvalidTransitionError, CodecError, journal
    │                            (JournalFencedError, JournalCorruptError), models (ModelError), tools, gate
    │                            (GateError), the transport's startup and idempotency errors
    ├── ResourceError            loopd.resources (.code, .reason → a Kubernetes Status): NotFound, Conflict,
    │                            StoreUnavailable …; the client's TransportError, TooManyRequests, ServerError
    ├── ReconcileError           loopd.resources.reconcile: TemporaryError (retryable), PermanentError
    ├── RuntimeApiError          loopd.runtime (.status, .type: the server's answer): InvalidRequest, Unauthorized,
    │                            Forbidden, NotFound (TaskNotReady), Conflict, CapacityFull and Unavailable (retryable),
    │                            ServerFailure, InvalidResponse
    ├── LoopServerError          loopd.server (.type → the JSON envelope):
    │   ├── StorageError         NotFound, Conflict (Fenced, the ledger's conflicts), StorageUnavailable …
    │   ├── HarnessEngineError   CapacityExceeded, UnknownTarget, GateForbidden, EngineClosed
    │   ├── AdapterError         the engine's adapters: ResumeUnsupported, ObservationLost, RemoteError
    │   └── ServerSetupError     loop-server refuses its settings (also a ValueError)
    ├── CliError                 loopd.cli: one line and an exit code (also ChatFailure, InputInterrupted)
    ├── (the floor's own)        loopd._infra.*: ApiError (the HTTP error envelope), DatabaseError,
    │                            SseFormatError, TaskSetClosed, LogSettingsError
    └── DataDirBusyError         another process holds the data directory (also a RuntimeError)

Rules: every exception class defined in loopd derives from `LoopdError` (a test walks the modules; a module's
private control-flow exceptions derive from it directly); a class keeps
a built-in base too (``ValueError``, ``RuntimeError``) where callers catch that; foreign exceptions are translated
at the boundary with ``raise Ours(...) from exc``. ``retryable`` is the one retry flag: a store, a model provider
and the reconcile runtime read it the same way. The markers carry no state and no ``__init__``: each layer's own
class decides the message and its extra fields (``NotFound`` of the resource API answers a Kubernetes ``Status``,
the server's answers its JSON envelope), so ``except NotFoundError`` catches either without changing how each is
answered. Must not do: import anything of loopd, or know a layer's classes.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ConflictError", "LoopdError", "NotFoundError", "UnavailableError"]


class LoopdError(Exception):
    """Base of every exception loopd raises on purpose."""

    retryable: ClassVar[bool] = False
    """Whether the same request may succeed if tried again later (a layer class may override it)."""


class NotFoundError(LoopdError):
    """Marker: the addressed thing (row, object, session) does not exist."""


class ConflictError(LoopdError):
    """Marker: the thing exists in a state that contradicts the request; re-read, then decide."""


class UnavailableError(LoopdError):
    """Marker: a dependency cannot answer now (unreachable, busy, closed, timed out); nothing was done. Retryable."""

    retryable: ClassVar[bool] = True
