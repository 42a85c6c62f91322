"""The harness's HTTP/SSE transport: `loopd harness serve`.

`create_app(rig, token=...)` builds the FastAPI app (sessions, inputs, gates, journal pages, a resumable SSE
stream, one JSON error envelope); `open_harness_server` runs it with uvicorn on a socket it binds; `serve` does both
for the standard rig until Ctrl-C. See ``_app`` for the routes and ``_streaming`` for the stream's contract.

Must not import the server, resources, runtime, operators or CLI layers (an import-linter contract checks it).
"""

from loopd.harness.serve._app import IDEMPOTENCY_FILE, create_app, registry_of
from loopd.harness.serve._errors import ApiError, ErrorType
from loopd.harness.serve._guard import PUBLIC_PATHS, is_loopback
from loopd.harness.serve._idempotency import (
    IdempotencyStore,
    IdempotencyStoreError,
    KeyRecord,
    MemoryIdempotencyStore,
    SqliteIdempotencyStore,
)
from loopd.harness.serve._registry import SessionRegistry
from loopd.harness.serve._server import InsecureBindError, RunningServer, check_bind, open_harness_server, serve

__all__ = [
    "IDEMPOTENCY_FILE",
    "PUBLIC_PATHS",
    "ApiError",
    "ErrorType",
    "IdempotencyStore",
    "IdempotencyStoreError",
    "InsecureBindError",
    "KeyRecord",
    "MemoryIdempotencyStore",
    "RunningServer",
    "SessionRegistry",
    "SqliteIdempotencyStore",
    "check_bind",
    "create_app",
    "is_loopback",
    "open_harness_server",
    "registry_of",
    "serve",
]
