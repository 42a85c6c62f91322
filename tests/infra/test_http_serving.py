"""The floor's uvicorn runner (``loopd._infra.serving.open_http_server``): options and failures. Serving itself,
graceful stops and the shutdown hook are in test_http.py; TLS end to end in tests/resources (the resource API)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from loopd._infra.http import RAW_SEND
from loopd._infra.serving import open_http_server
from tests.support.waiting import eventually


async def _hello(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def _app() -> Starlette:
    return Starlette(routes=[Route("/", _hello)])


async def test_it_serves_on_a_free_port_and_says_where() -> None:
    async with open_http_server(_app(), lifespan="off", http="h11") as running:
        assert running.url == f"http://127.0.0.1:{running.port}" and running.port > 0
        async with httpx.AsyncClient(timeout=5.0) as client:
            assert (await client.get(running.url)).text == "hello"


async def test_the_servers_send_is_in_the_scope_only_while_its_request_runs() -> None:
    # Published for event streams' direct writes; left in the scope after the request, it would tie uvicorn's
    # request cycle (which holds the scope) to itself: a reference cycle per request.
    scopes: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        assert callable(scope["extensions"][RAW_SEND])
        scopes.append(scope)
        await PlainTextResponse("hello")(scope, receive, send)

    async with open_http_server(app, lifespan="off") as running, httpx.AsyncClient(timeout=5.0) as client:
        assert (await client.get(running.url)).text == "hello"
        await eventually(lambda: RAW_SEND not in scopes[0]["extensions"] or None, what="the send withdrawn")


async def test_a_port_in_use_is_refused_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            async with open_http_server(_app(), port=port):
                pytest.fail("unreachable")


@pytest.mark.parametrize(("cert", "key"), [(Path("c.pem"), None), (None, Path("k.pem"))])
async def test_tls_takes_a_certificate_and_its_key_together(cert: Path | None, key: Path | None) -> None:
    with pytest.raises(ValueError, match="both"):
        async with open_http_server(_app(), tls_cert=cert, tls_key=key):
            pytest.fail("unreachable")


async def test_without_a_log_level_the_process_logging_is_left_alone() -> None:
    uvicorn_error = logging.getLogger("uvicorn.error")
    before = (uvicorn_error.level, list(uvicorn_error.handlers), uvicorn_error.propagate)
    uvicorn_error.setLevel(logging.CRITICAL)
    try:
        async with open_http_server(_app(), lifespan="off", log_level=None):
            assert uvicorn_error.level == logging.CRITICAL
    finally:
        uvicorn_error.setLevel(before[0])
    assert (list(uvicorn_error.handlers), uvicorn_error.propagate) == before[1:]
