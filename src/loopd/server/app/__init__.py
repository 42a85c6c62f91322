"""The loop-server HTTP app: every service's routes, the sweepers and the security middleware over one context.

Public face: `create_server_app` (the FastAPI app over a `ServerContext`), `Readiness` (extra ``/readyz`` checks)
and `DEFAULT_HEARTBEAT`.
This package sits above the services (chat, Human, registry) it serves, and below the composition root, which
builds the `ServerContext` and passes the routers of the engine and the ledger.
Must not do: build services or bind sockets.
"""

from loopd.server.app._app import DEFAULT_HEARTBEAT, Readiness, create_server_app
from loopd.server.app._context import ServerContext

__all__ = ["DEFAULT_HEARTBEAT", "Readiness", "ServerContext", "create_server_app"]
