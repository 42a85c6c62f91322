"""The harness's HTTP/SSE transport: `loopd harness serve`.

`create_app(rig, token=...)` builds the FastAPI app (sessions, inputs, gates, journal pages, a resumable SSE
stream, the error envelope); `open_harness_server` runs it with uvicorn on a socket it binds; `serve` does both
for the standard rig until Ctrl-C. See ``_app`` for the routes and ``_streaming`` for the stream's contract.

This package holds the transport's own policy: the routes, the bearer token and loopback rules (``_guard``), the
translation of harness errors (``_errors``) and the idempotency keys. The HTTP mechanism under it (error
envelope, body caps, SSE framing and response, the uvicorn runner, /docs) is the floor's, ``loopd._infra``.

Must not import the server, resources, runtime, operators or CLI layers (an import-linter contract checks it).
"""

from loopd.harness.serve._app import IDEMPOTENCY_FILE, create_app, sessions_of
from loopd.harness.serve._guard import PUBLIC_PATHS
from loopd.harness.serve._idempotency import (
    IdempotencyStore,
    IdempotencyStoreError,
    KeyRecord,
    MemoryIdempotencyStore,
    SqliteIdempotencyStore,
)
from loopd.harness.serve._server import InsecureBindError, check_bind, open_harness_server, serve
from loopd.harness.serve._sessions import ServedSessions
from loopd.harness.serve._workspaces import SessionWorkspaces

__all__ = [
    "IDEMPOTENCY_FILE",
    "PUBLIC_PATHS",
    "IdempotencyStore",
    "IdempotencyStoreError",
    "InsecureBindError",
    "KeyRecord",
    "MemoryIdempotencyStore",
    "ServedSessions",
    "SessionWorkspaces",
    "SqliteIdempotencyStore",
    "check_bind",
    "create_app",
    "open_harness_server",
    "serve",
    "sessions_of",
]
