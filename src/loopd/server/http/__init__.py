"""loop-server's HTTP layer: the app factory, identity and security, the error envelope, SSE, serving.

Public face: `create_server_app` (the FastAPI app over a `ServerContext`), `Identity` with the dependencies
`current_identity` / `trusted_identity` / `admin_identity`, `ServerSecurity`, `AccessStore` (issued tokens,
sign-in codes and cookies), `ApiError` (raise it under any route) and the error
helpers, `EventStreamResponse` / `sse_frame`, and `open_http_server` (uvicorn on a bound socket).
The mechanism under these (body cap, SSE response, error handlers, serving) is ``loopd.harness.serve``'s; this
package holds the server's policy: identities, cookies, the Origin check, storage-error mapping.
Must not import ``loopd.server.chat``, ``.human`` or ``.registry`` at import time: they import this package.
"""

from loopd.harness.serve import ApiError, ErrorType, RunningServer, open_http_server
from loopd.server.http._access import AccessStore, SigninCode
from loopd.server.http._app import create_server_app
from loopd.server.http._context import ServerContext
from loopd.server.http._errors import ERROR_RESPONSES, ErrorEnvelope, api_error_of, error_body, error_response
from loopd.server.http._identity import (
    Identity,
    IdentityKind,
    admin_identity,
    current_identity,
    identity_of,
    trusted_identity,
)
from loopd.server.http._security import COOKIE_NAME, ServerSecurity, human_key, tokens_of
from loopd.server.http._sse import HEARTBEAT, EventStreamResponse, sse_frame

RunningHttpServer = RunningServer
"""What `open_http_server` yields: ``url``, ``host``, ``port``, ``stop()`` and ``await wait()``."""

__all__ = [
    "COOKIE_NAME",
    "ERROR_RESPONSES",
    "HEARTBEAT",
    "AccessStore",
    "ApiError",
    "ErrorEnvelope",
    "ErrorType",
    "EventStreamResponse",
    "Identity",
    "IdentityKind",
    "RunningHttpServer",
    "ServerContext",
    "ServerSecurity",
    "SigninCode",
    "admin_identity",
    "api_error_of",
    "create_server_app",
    "current_identity",
    "error_body",
    "error_response",
    "human_key",
    "identity_of",
    "open_http_server",
    "sse_frame",
    "tokens_of",
    "trusted_identity",
]
