"""Fixtures: a loop-server rig with a Harness Engine (scripted adapter, on the rig's virtual clock) served on a real
loopback socket, and clients for the user, the responder and other operators."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.engine import Finished, HarnessEngine, TextSet, engine_router
from loopd.server.http import open_http_server
from tests.server_engine.conftest import ScriptedAdapter, make_engine, scripted
from tests.server_http.support import (
    CommitFailingDatabase,
    Rig,
    backend_fixture,
    build_rig,
    open_db,
    postgres_server,
    real_client,
    shared_postgres_dsn,
)
from tests.server_storage.conftest import database_url_for

backend = backend_fixture("sqlite", "postgres")

__all__ = ["Api", "api", "backend", "postgres_server", "shared_postgres_dsn"]


class _Clock(VirtualClock):
    """Virtual time for the database, the engine and the waits' bounds (callable too: ``now()``)."""

    def __call__(self) -> datetime:
        return self.now()


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@dataclass
class Api:
    """The served rig: ``url``, the engine and its scripted adapters (``hello`` finishes at once, ``parked``
    stops after its first text until the test releases the run)."""

    rig: Rig
    url: str
    engine: HarnessEngine
    adapter: ScriptedAdapter
    clock: VirtualClock

    def user(self) -> httpx.AsyncClient:
        return real_client(self.rig, self.url)

    def operator(self, key: str = "echo") -> httpx.AsyncClient:
        return real_client(self.rig, self.url, actor=f"operator:{key}")

    async def until(self, predicate: Callable[[], Awaitable[bool]], *, timeout: float = 10.0) -> None:
        """Check ``predicate`` until it holds, moving virtual time in small steps between checks (so the engine's
        polls come due); ``timeout`` bounds the real time spent (a guard, not a measurement)."""
        async with asyncio.timeout(timeout):
            while not await predicate():
                await asyncio.sleep(0.002)
                await self.clock.advance(0.02)


@pytest.fixture
async def api(backend: str, tmp_path: Path, request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[Api]:
    url = database_url_for(backend, tmp_path, request)
    db = await open_db(url, clock, cls=CommitFailingDatabase)  # type: ignore[arg-type,unused-ignore]
    rig = build_rig(db, clock)  # type: ignore[arg-type,unused-ignore]  # the support's clock type is changing
    adapter = ScriptedAdapter(script=scripted(TextSet("working"), None, TextSet("done"), Finished("done")))
    try:
        async with make_engine(db, {"parked": adapter}, clock=clock, bus=rig.ctx.bus, capacity=4) as engine:
            rig.app.include_router(
                engine_router(
                    engine, asker_of=rig.task_api.asker_of, tasks=rig.task_api, stopping=rig.task_api.stopping
                )
            )
            async with open_http_server(rig.app, graceful_timeout=5.0) as server:
                yield Api(rig, server.url, engine, adapter, clock)
    finally:
        await rig.aclose()
        await db.aclose()
