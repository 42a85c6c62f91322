"""loop-server's HTTP plumbing: identity and security, the access routes, the error envelope, SSE, serving.

Public face: `Identity` with the dependencies `current_identity` / `trusted_identity` / `admin_identity`,
`ServerSecurity` and its `SecurityMiddleware`, `AccessStore` (issued tokens, sign-in codes and cookies) and its
`access_router`, `ApiError` (raise it under any route) and the error helpers with `install_error_handlers`,
`EventStreamResponse` / `sse_frame`, and `open_http_server` (uvicorn on a bound socket).
The mechanism under these (body cap, SSE response, error handlers, serving) is the floor's (``loopd._infra``);
this package holds the server's policy: identities, cookies, the Origin check, storage-error mapping.
Must not import the services (``loopd.server.chat``, ``.human``, ``.registry``, ``.engine``, …): they import this
package. The app that serves them all is ``loopd.server.app``'s.
"""

from loopd._infra.http_errors import ApiError, ErrorType
from loopd._infra.serving import RunningServer, open_http_server
from loopd.server.http._access import AccessStore, SigninCode
from loopd.server.http._access_routes import access_router
from loopd.server.http._errors import (
    ERROR_RESPONSES,
    ErrorEnvelope,
    api_error_of,
    error_body,
    error_response,
    install_error_handlers,
)
from loopd.server.http._identity import (
    Identity,
    IdentityKind,
    admin_identity,
    current_identity,
    identity_of,
    trusted_identity,
)
from loopd.server.http._security import COOKIE_NAME, SecurityMiddleware, ServerSecurity, human_key, tokens_of
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
    "SecurityMiddleware",
    "ServerSecurity",
    "SigninCode",
    "access_router",
    "admin_identity",
    "api_error_of",
    "current_identity",
    "error_body",
    "error_response",
    "human_key",
    "identity_of",
    "install_error_handlers",
    "open_http_server",
    "sse_frame",
    "tokens_of",
    "trusted_identity",
]
