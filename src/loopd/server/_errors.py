"""The root of loop-server's exception tree: every error the server raises on purpose carries its API error type.

::

    LoopServerError                 .type (API error type), .retryable, .message
    ├── StorageError                the database and its rows (loopd.server.storage; the ledger extends it)
    ├── HarnessEngineError          the Harness Engine's refusals (loopd.server.engine)
    ├── AdapterError                the engine's adapters (loopd.server.engine); mapped to phases, never answered
    └── ServerSetupError            the server refuses its settings (a non-loopback host without opt-in, a
                                    workspaces directory inside the data directory); also a ``ValueError``

The HTTP API answers any of them by ``type`` (`loopd.server.http.api_error_of`). Named ``LoopServerError``, not
``ServerError``: the resource client's ``ServerError`` is a remote 5xx. Must not do: I/O, import anything of loopd
but the floor.
"""

from __future__ import annotations

from typing import ClassVar

from loopd._infra.errors import LoopdError


class LoopServerError(LoopdError):
    """Base of every error loop-server raises on purpose."""

    type: ClassVar[str] = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ServerSetupError(LoopServerError, ValueError):
    """loop-server refuses the settings it was given; the message says which and why."""

    type = "invalid_request"
