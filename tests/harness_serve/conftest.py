"""Fixtures: a scripted rig behind a real uvicorn on 127.0.0.1 (free port) and an httpx client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from loopd.harness import Journal, LoopDefinition, Reply, Rig, ScriptedModel, Session, SqliteJournal, Tool
from loopd.harness.gate import AccessConfig, MemoryRuleStore, RuleStore
from loopd.harness.models import ModelRequest
from loopd.harness.serve import ServedSessions, create_app, open_harness_server, sessions_of


@dataclass
class Served:
    url: str
    app: FastAPI
    rig: Rig
    client: httpx.AsyncClient

    @property
    def registry(self) -> ServedSessions:
        return sessions_of(self.app)

    def session(self, session_id: str) -> Session:
        """The live session (fails the test if it is not live here)."""
        session = self.registry.live(session_id)
        assert session is not None, f"session {session_id} is not live"
        return session


def scripted_rig(
    journal: Journal,
    script: Sequence[Reply] | Callable[[ModelRequest], Reply],
    *,
    tools: Sequence[Tool] = (),
    workspace: Path | None = None,
    rules: RuleStore | None = None,
    access: AccessConfig | None = None,
    gate_timeout: float = 30.0,
) -> Rig:
    model = ScriptedModel(script, default=Reply(text="ok"))
    loop = LoopDefinition(
        name="main",
        model=model,
        tools=tuple(tools),
        access=access or AccessConfig(),
        gate_timeout=gate_timeout,
    )
    return Rig(loops=[loop], journal=journal, name="test", workspace=workspace, rules=rules or MemoryRuleStore())


def client_for(url: str, *, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=30.0, headers=headers)  # a hang only


@asynccontextmanager
async def serving(rig: Rig, *, token: str | None = None, **options: Any) -> AsyncIterator[Served]:
    app = create_app(rig, token=token, **options)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        open_harness_server(app, graceful_timeout=2.0) as running,
        client_for(running.url, headers=headers) as client,
    ):
        yield Served(running.url, app, rig, client)


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[SqliteJournal]:
    j = await SqliteJournal.open(tmp_path / "journal.db")
    yield j
    await j.aclose()


def text_reply(text: str, *, chunk_size: int = 4, chunk_delay: float = 0.0) -> Reply:
    return Reply(text=text, chunk_size=chunk_size, chunk_delay=chunk_delay)
