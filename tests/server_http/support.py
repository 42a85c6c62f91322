"""Shared test rig for the loop-server HTTP, chat and Human suites: a context over a real database and an
in-memory Task API, clients (in-process ASGI or over a real uvicorn socket) and an SSE reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI

from loopd._infra.clock import Clock, VirtualClock
from loopd._infra.sse import read_sse
from loopd.resources.client import TASKS, InMemoryClient
from loopd.server.app import ServerContext, create_server_app
from loopd.server.chat import ChatRequests, ConversationReader, ResourceTaskGateway, TaskApi, TaskGateway
from loopd.server.http import ServerSecurity, open_http_server
from loopd.server.human import HumanService
from loopd.server.registry import ActorInfo, RegistryService
from loopd.server.storage import Database, DatabaseOptions, StorageUnavailable
from loopd.server.streams import ConversationBus
from tests.server_storage.conftest import database_url_for, shared_postgres_dsn
from tests.support.postgres import postgres_server

__all__ = ["postgres_server", "shared_postgres_dsn"]  # fixtures the suites re-export

TOKEN = "test-token-0123456789"
BASE = "http://127.0.0.1:8080"
ORIGIN = BASE
BUILTIN = (ActorInfo("harness", "assistant", "Assistant", "The built-in harness"), ActorInfo("operator", "echo"))


class ControlledGateway:
    """A `TaskGateway` over the in-memory Task API whose steps can be made to fail, and that records calls."""

    def __init__(self, inner: TaskGateway) -> None:
        self.inner = inner
        self.fail_create: Exception | None = None
        self.fail_delete: Exception | None = None
        self.fail_bump: Exception | None = None
        self.during_create: Callable[[str], Any] | None = None
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.bumped: list[str] = []

    async def create(self, task_id: str, target_kind: str, target_key: str) -> str:
        if self.fail_create is not None:
            raise self.fail_create
        uid = await self.inner.create(task_id, target_kind, target_key)
        self.created.append(task_id)
        if self.during_create is not None:
            await self.during_create(task_id)
        return uid

    async def get(self, task_id: str) -> dict[str, Any] | None:
        return await self.inner.get(task_id)

    async def delete(self, task_id: str) -> None:
        if self.fail_delete is not None:
            raise self.fail_delete
        await self.inner.delete(task_id)
        self.deleted.append(task_id)

    async def bump_revision(self, task_id: str) -> None:
        if self.fail_bump is not None:
            raise self.fail_bump
        await self.inner.bump_revision(task_id)
        self.bumped.append(task_id)


class CommitFailingDatabase(Database):
    """A database whose next ``fail_commits`` write transactions fail at commit (they roll back instead)."""

    fail_commits = 0

    @asynccontextmanager
    async def transaction(self, *, read_only: bool = False) -> AsyncIterator[Any]:
        async with super().transaction(read_only=read_only) as tx:
            yield tx
            if not read_only and self.fail_commits > 0:
                self.fail_commits -= 1
                raise StorageUnavailable("simulated failure at commit")


@dataclass
class Rig:
    db: Database
    clock: VirtualClock
    resources: InMemoryClient
    gateway: ControlledGateway
    ctx: ServerContext
    app: FastAPI
    opened: list[httpx.AsyncClient] = field(default_factory=list)

    @property
    def conversations(self) -> ConversationReader:
        return self.ctx.conversations

    @property
    def chat(self) -> ChatRequests:
        return self.ctx.chat

    @property
    def task_api(self) -> TaskApi:
        return self.ctx.task_api

    @property
    def human(self) -> HumanService:
        return self.ctx.human

    def client(
        self,
        *,
        token: bool = True,
        actor: str | None = None,
        cookie: str | None = None,
        origin: str | None = None,
        base_url: str = BASE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> httpx.AsyncClient:
        """An in-process client (ASGI), or one over ``transport``; closed with the rig."""
        headers: dict[str, str] = {}
        if token:
            headers["Authorization"] = f"Bearer {TOKEN}"
        if actor is not None:
            headers["X-Loopd-Actor"] = actor
        if origin is not None:
            headers["Origin"] = origin
        cookies = {"loopd-human": cookie} if cookie is not None else None
        client = httpx.AsyncClient(
            transport=transport or httpx.ASGITransport(app=self.app, raise_app_exceptions=False),
            base_url=base_url,
            headers=headers,
            cookies=cookies,
            timeout=10.0,
        )
        self.opened.append(client)
        return client

    def operator(self, key: str = "echo") -> httpx.AsyncClient:
        return self.client(actor=f"operator:{key}")

    async def task(self, task_id: str) -> dict[str, Any] | None:
        return await self.gateway.get(task_id)

    async def aclose(self) -> None:
        for client in self.opened:
            await client.aclose()


def build_rig(
    db: Database,
    clock: VirtualClock,
    *,
    heartbeat: float = 15.0,
    poll_interval: float = 0.05,
    max_body_bytes: int = 1_048_576,
    routers: Sequence[APIRouter] = (),
    max_timeout_seconds: float = 3600.0,
    browser_hosts: frozenset[str] = frozenset(),
    resources: InMemoryClient | None = None,
    bus_clock: Clock | None = None,
) -> Rig:
    resources = resources or InMemoryClient()
    gateway = ControlledGateway(ResourceTaskGateway(resources, timeout=5.0))
    bus = ConversationBus(clock=bus_clock)  # the system clock unless a test puts streams on virtual time
    registry = RegistryService(db, builtin_actors=BUILTIN)
    conversations = ConversationReader(db, bus, poll_interval=poll_interval)
    chat = ChatRequests(db, bus, gateway, targets=registry)
    human = HumanService(chat, max_timeout_seconds=max_timeout_seconds)
    ctx = ServerContext(
        db=db,
        bus=bus,
        security=ServerSecurity(tokens=(TOKEN,), max_body_bytes=max_body_bytes, browser_hosts=browser_hosts),
        conversations=conversations,
        chat=chat,
        task_api=TaskApi(db, bus, gateway),
        human=human,
        registry=registry,
    )
    app = create_server_app(ctx, routers=routers, sweepers=False, heartbeat=heartbeat)
    return Rig(db, clock, resources, gateway, ctx, app)


async def open_db(url: str, clock: VirtualClock, *, cls: type[Database] = Database) -> Database:
    return await cls.open(url, options=DatabaseOptions(clock=clock, operation_timeout=30.0))


@asynccontextmanager
async def served(rig: Rig) -> AsyncIterator[str]:
    """Serve the rig's app on a real loopback socket; yields its base URL."""
    async with open_http_server(rig.app, graceful_timeout=2.0) as running:
        yield running.url


def real_client(rig: Rig, url: str, **options: Any) -> httpx.AsyncClient:
    return rig.client(base_url=url, transport=httpx.AsyncHTTPTransport(), **options)


# --- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> VirtualClock:
    """The database's clock (stamps, leases, deadlines): it moves only when the test advances it."""
    return VirtualClock()


def backend_fixture(*backends: str) -> Any:
    params = [pytest.param(b, marks=pytest.mark.postgres) if b == "postgres" else b for b in backends]

    @pytest.fixture(params=params)
    def backend(request: pytest.FixtureRequest) -> str:
        return str(request.param)

    return backend


@pytest.fixture
async def rig(backend: str, tmp_path: Path, request: pytest.FixtureRequest, clock: VirtualClock) -> AsyncIterator[Rig]:
    url = database_url_for(backend, tmp_path, request)
    db = await open_db(url, clock, cls=CommitFailingDatabase)
    built = build_rig(db, clock)
    try:
        yield built
    finally:
        await built.aclose()
        await db.aclose()


# --- chat helpers --------------------------------------------------------------------------------------------


async def new_conversation(client: httpx.AsyncClient, name: str = "") -> str:
    response = await client.post("/v1/conversations", json={"name": name})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def ask(
    client: httpx.AsyncClient, conversation_id: str, text: str = "hello", *, target: str = "operator:echo"
) -> dict[str, Any]:
    kind, key = target.split(":", 1)
    response = await client.post(
        f"/v1/conversations/{conversation_id}/messages", json={"target": {"kind": kind, "key": key}, "text": text}
    )
    assert response.status_code == 201, response.text
    assert response.headers["X-Loopd-Task-ID"] == response.json()["task_id"]
    return dict(response.json())


def text_events(block_id: str, *pieces: str) -> list[dict[str, Any]]:
    """A text block and appends to it."""
    events: list[dict[str, Any]] = [{"op": "set", "block": {"id": block_id, "type": "text", "content": ""}}]
    events += [{"op": "append", "mask": "block.content", "block": {"id": block_id, "content": p}} for p in pieces]
    return events


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return str(body["error"]["type"])


# --- SSE -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    id: int | None
    event: str | None
    data: dict[str, Any] | None
    comments: tuple[str, ...]


async def frames_of(response: httpx.Response) -> AsyncIterator[Frame]:
    """Every SSE message of a streaming response, in order (comments included)."""
    async for message in read_sse(response.aiter_text()):
        yield Frame(
            int(message.id) if message.id else None,
            message.event,
            json.loads(message.data) if message.data is not None else None,
            message.comments,
        )


def fold_by_message(datas: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Fold stream payloads per message id into snapshots."""
    from loopd.agentue import fold

    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for data in datas:
        grouped.setdefault(str(data["message_id"]), []).append(data["event"])
    result: dict[str, dict[str, Any]] = {}
    for message_id, events in grouped.items():
        state = fold(events)
        assert state.model is not None
        result[message_id] = state.model.to_json()
    return result


async def task_object(rig: Rig, task_id: str) -> dict[str, Any] | None:
    from loopd.resources import NotFound

    try:
        return await rig.resources.get(TASKS, task_id, namespace="default")
    except NotFound:
        return None
