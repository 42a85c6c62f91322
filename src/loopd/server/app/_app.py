"""`create_server_app`: the loop-server FastAPI app over a `ServerContext`.

The app serves: ``GET /healthz`` (liveness), ``GET /readyz`` (readiness: the database answers, not shutting down),
``GET /v1/me``, the web UI at ``/`` with its ``/assets/``
(``loopd.server.webui``), the sign-in link and token routes (``loopd.server.http.access_router``), the chat,
Human and registry routes of the context's services, and any extra ``routers`` (the Harness Engine's, the
ledger's). Every error is the envelope of ``loopd.server.http``;
`SecurityMiddleware` authenticates every request (with the `AccessStore` over the context's database). With
``sweepers`` the app's lifespan runs the completion sweeper and the Human deadline sweeper.
Must not do: bind sockets (``loopd.server.http.open_http_server``), build services (the composition root does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, FastAPI, Response
from pydantic import BaseModel, ConfigDict, Field

from loopd import __version__
from loopd._infra.docs import install_docs
from loopd._infra.http_errors import ApiError, drop_validation_responses
from loopd._infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from loopd._infra.metrics import MetricsMiddleware
from loopd.server.app._context import ServerContext
from loopd.server.chat import ConversationForks, Sweeper, chat_router, fork_router, task_router
from loopd.server.http import (
    COOKIE_NAME,
    ERROR_RESPONSES,
    AccessStore,
    Identity,
    SecurityMiddleware,
    access_router,
    current_identity,
    install_error_handlers,
)
from loopd.server.human import human_router
from loopd.server.registry import registry_router
from loopd.server.storage import StorageError
from loopd.server.webui import webui_router

_log = logging.getLogger("loopd.server")

DEFAULT_HEARTBEAT: Final = 15.0

Readiness = Callable[[], Awaitable[Mapping[str, str | None]]]
"""``/readyz``'s checks: each name → None when it passes, else why it fails (one line). It bounds its own I/O."""
READY_TIMEOUT: Final = 2.0
"""Seconds ``/readyz`` waits for the database before answering 503."""


class _ServerApi(FastAPI):
    """FastAPI whose OpenAPI document says what the app does: 400 for invalid requests (never 422), and both ways
    to sign in (a bearer token, the browser cookie)."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is not None:
            return self.openapi_schema
        schema = super().openapi()
        drop_validation_responses(schema)
        components = schema.setdefault("components", {})
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "cookie": {"type": "apiKey", "in": "cookie", "name": COOKIE_NAME},
        }
        schema["security"] = [{"bearer": []}, {"cookie": []}]
        self.openapi_schema = schema
        return schema


def create_server_app(
    ctx: ServerContext,
    *,
    routers: Sequence[APIRouter] = (),
    sweepers: bool = True,
    heartbeat: float = DEFAULT_HEARTBEAT,
    webui: Path | None = None,
    readiness: Readiness | None = None,
) -> FastAPI:
    """The loop-server app over ``ctx``; ``routers`` are included after the built-in ones; the sweepers' intervals
    run on ``ctx.clock``; ``webui`` is the built web page's folder (default: the package's ``webui/dist``);
    ``readiness`` the checks ``/readyz`` runs besides the database's (the composition root's: the Kubernetes API)."""
    background = [
        Sweeper("completions", lambda: ctx.task_api.sweep_closing(limit=20), clock=ctx.clock),
        Sweeper("deleted-tasks", lambda: ctx.task_api.sweep_orphans(limit=50), interval=10.0, clock=ctx.clock),
        Sweeper("human-deadlines", lambda: ctx.human.sweep_deadlines(limit=100), clock=ctx.clock),
    ]

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            async with asyncio.TaskGroup() as group:  # the sweepers run as long as the app
                running = [
                    group.create_task(sweeper.run(), name=f"loopd-sweeper-{sweeper.name}")
                    for sweeper in (background if sweepers else ())
                ]
                try:
                    yield
                finally:
                    begin_shutdown()
                    for task in running:
                        task.cancel()  # the group's exit waits until they have ended
        finally:
            await ctx.conversations.feeds.aclose()  # then the feeds' tasks end with the app

    app = _ServerApi(
        title="loopd server",
        version=__version__,
        summary="Conversations, chat requests and their Tasks, Human Ask/Confirm, the responder registry.",
        lifespan=lifespan,
        docs_url=None,  # `install_docs` serves /docs from bundled assets (FastAPI's page needs a CDN)
        redoc_url=None,
    )
    app.state.context = ctx

    def begin_shutdown() -> None:
        ctx.conversations.begin_shutdown()  # streams end
        ctx.task_api.begin_shutdown()  # bounded waits answer

    app.state.begin_shutdown = begin_shutdown
    install_error_handlers(app)
    access = AccessStore(ctx.db, signin_ttl=ctx.security.signin_ttl)
    app.include_router(_base_routes(ctx, readiness))
    app.include_router(access_router(access, ctx.security))
    app.include_router(chat_router(ctx.conversations, ctx.chat, heartbeat=heartbeat))
    app.include_router(fork_router(ConversationForks(ctx.chat)))
    app.include_router(task_router(ctx.task_api))
    app.include_router(human_router(ctx.human, stopping=ctx.task_api.stopping))
    app.include_router(registry_router(ctx.registry))
    app.include_router(webui_router(webui))
    for router in routers:
        app.include_router(router)
    install_docs(app)
    app.add_middleware(SecurityMiddleware, security=ctx.security, access=access)
    if ctx.metrics is not None:  # outside the front door: refused requests are counted too
        app.add_middleware(MetricsMiddleware, metrics=ctx.metrics)
    return app


class Health(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool


class Me(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["user", "operator", "harness"]
    key: str
    trusted: bool = Field(description="Whether you signed in with a server token.")


def _base_routes(ctx: ServerContext, readiness: Readiness | None) -> APIRouter:
    router = APIRouter(responses=ERROR_RESPONSES, tags=["server"])

    @router.get("/healthz")
    async def healthz() -> Health:
        """Liveness; needs no credentials."""
        return Health(ok=True)

    @router.get("/readyz")
    async def readyz() -> Health:
        """Readiness (needs no credentials): 503 ``service_unavailable`` while the server shuts down, when its
        database does not answer within 2 s, or when another check fails (the Kubernetes API of its Tasks does not
        answer), so a load balancer sends requests to other replicas."""
        if ctx.task_api.stopping.is_set():
            raise ApiError("service_unavailable", "the server is shutting down")
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await ctx.db.schema_version()
        except TimeoutError as exc:
            raise ApiError("service_unavailable", f"the database did not answer within {READY_TIMEOUT:g} s") from exc
        except StorageError as exc:
            # Anyone may ask /readyz: the reason (hosts, driver messages) goes to the log, not to the caller.
            _log.warning("not ready: the database does not answer: %s", exc)
            raise ApiError("service_unavailable", "the database does not answer") from exc
        failed = {name: why for name, why in (await readiness()).items() if why} if readiness is not None else {}
        if failed:
            raise ApiError("service_unavailable", "; ".join(f"{name}: {why}" for name, why in failed.items()))
        return Health(ok=True)

    @router.get("/v1/me")
    async def me(caller: Annotated[Identity, Depends(current_identity)]) -> Me:
        """Who the server thinks you are (a browser without the cookie gets one here)."""
        return Me(kind=caller.kind, key=caller.key, trusted=caller.trusted)

    if ctx.metrics is not None:
        metrics = ctx.metrics

        @router.get("/metrics", response_class=Response, responses={200: {"content": {METRICS_CONTENT_TYPE: {}}}})
        async def prometheus_metrics(caller: Annotated[Identity, Depends(current_identity)]) -> Response:
            """This server's metrics in the Prometheus text format. Needs a bearer token: the admin token or an
            actor token (``loopd token create operator:prometheus``); a browser session gets 403."""
            if not (caller.admin or caller.kind != "user"):
                raise ApiError("forbidden", "metrics need the admin token or an actor token, not a browser session")
            return Response(metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    return router
