"""The harness's HTTP/SSE transport: `loopd harness serve`.

`create_app(rig, token=...)` builds the FastAPI app (sessions, inputs, gates, journal pages, a resumable SSE
stream, one JSON error envelope); `open_harness_server` runs it with uvicorn on a socket it binds; `serve` does both
for the standard rig until Ctrl-C. See ``_app`` for the routes and ``_streaming`` for the stream's contract.

The HTTP mechanism loop-server shares (``_http``): `buffer_json_body` and the request helpers, `sse_message` /
`EventStreamResponse`, `install_error_handlers` over the envelope of `error_response`, and `open_http_server`
(uvicorn on a socket it binds); and (``_docs``) `install_docs`, Swagger UI at ``/docs`` from bundled assets.
Policy (who may call) stays with each app.

Must not import the server, resources, runtime, operators or CLI layers (an import-linter contract checks it).
"""

from loopd.harness.serve._app import IDEMPOTENCY_FILE, create_app, registry_of
from loopd.harness.serve._docs import DOCS_ASSETS_PATH, DOCS_PATH, install_docs
from loopd.harness.serve._errors import STATUS_OF, TYPE_OF_STATUS, ApiError, ErrorType, error_body, error_response
from loopd.harness.serve._guard import PUBLIC_PATHS, peer_is_loopback
from loopd.harness.serve._http import (
    MAX_JSON_DEPTH,
    SSE_PING,
    WRITE_METHODS,
    EventStreamResponse,
    RunningServer,
    buffer_json_body,
    drop_validation_responses,
    host_name,
    install_error_handlers,
    is_loopback,
    open_http_server,
    request_headers,
    sse_message,
)
from loopd.harness.serve._idempotency import (
    IdempotencyStore,
    IdempotencyStoreError,
    KeyRecord,
    MemoryIdempotencyStore,
    SqliteIdempotencyStore,
)
from loopd.harness.serve._server import InsecureBindError, check_bind, open_harness_server, serve
from loopd.harness.serve._sessions import SessionRegistry

__all__ = [
    "DOCS_ASSETS_PATH",
    "DOCS_PATH",
    "IDEMPOTENCY_FILE",
    "MAX_JSON_DEPTH",
    "PUBLIC_PATHS",
    "SSE_PING",
    "STATUS_OF",
    "TYPE_OF_STATUS",
    "WRITE_METHODS",
    "ApiError",
    "ErrorType",
    "EventStreamResponse",
    "IdempotencyStore",
    "IdempotencyStoreError",
    "InsecureBindError",
    "KeyRecord",
    "MemoryIdempotencyStore",
    "RunningServer",
    "SessionRegistry",
    "SqliteIdempotencyStore",
    "buffer_json_body",
    "check_bind",
    "create_app",
    "drop_validation_responses",
    "error_body",
    "error_response",
    "host_name",
    "install_docs",
    "install_error_handlers",
    "is_loopback",
    "open_harness_server",
    "open_http_server",
    "peer_is_loopback",
    "registry_of",
    "request_headers",
    "serve",
    "sse_message",
]
