"""Fixtures for the Harness Engine: databases (SQLite, and PostgreSQL where marked), a virtual clock shared by the
database and the engines (leases, deadlines, polls and lease renewals run on it), a scripted adapter whose runs the
tests steer, and helpers to make conversations and messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.agentue import fold
from loopd.server.engine import (
    AdapterRequest,
    Finished,
    GateAnswer,
    HarnessAdapter,
    HarnessEngine,
    ResumeUnsupported,
    TextPreview,
    TextSet,
    Update,
)
from loopd.server.ledger import EffectKind, Idempotency, SqlLedgerStore
from loopd.server.storage import Database, DatabaseOptions, HarnessCall, NewMessage
from loopd.server.streams import ConversationBus, empty_model, open_message
from tests.support.postgres import PostgresServer, postgres_dsn, postgres_server
from tests.support.waiting import eventually

__all__ = ["postgres_dsn", "postgres_server"]


_current: list[VirtualClock] = []  # the clock of the running test: engines and `until` use it unless told otherwise


@pytest.fixture
def clock() -> Iterator[VirtualClock]:
    """Virtual time for the test: it moves when a test advances it or when `until` waits for background work."""
    clock = VirtualClock()
    _current.append(clock)
    try:
        yield clock
    finally:
        _current.remove(clock)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def shared_postgres_dsn(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


def _reset_postgres(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'schema_migrations'"
        ).fetchall()
        if rows:
            conn.execute("TRUNCATE " + ", ".join(f'"{row[0]}"' for row in rows))


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        dsn = str(request.getfixturevalue("shared_postgres_dsn"))
        _reset_postgres(dsn)
        return dsn
    return str(tmp_path / "loopd.db")


OpenDb = Callable[[], Awaitable[Database]]


@pytest.fixture
async def open_db(database_url: str, clock: VirtualClock) -> AsyncIterator[OpenDb]:
    """Handles on one database (several at once act like replicas); all closed afterwards."""
    opened: list[Database] = []

    async def factory() -> Database:
        database = await Database.open(database_url, options=DatabaseOptions(clock=clock, operation_timeout=30.0))
        opened.append(database)
        return database

    try:
        yield factory
    finally:
        for database in opened:
            await database.aclose()


@pytest.fixture
async def db(open_db: OpenDb) -> Database:
    return await open_db()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return str(tmp_path / "loopd.db")


@pytest.fixture
async def sqlite_db(sqlite_url: str, clock: VirtualClock) -> AsyncIterator[Database]:
    database = await Database.open(sqlite_url, options=DatabaseOptions(clock=clock, operation_timeout=30.0))
    try:
        yield database
    finally:
        await database.aclose()


# --- conversations and messages --------------------------------------------------------------------------------


async def new_conversation(db: Database, owner: str = "alice") -> str:
    async with db.transaction() as tx:
        return (await tx.conversations.create(actor_kind="user", actor_key=owner)).id


async def new_response(db: Database, conversation_id: str, *, task_id: str = "task-1") -> str:
    """A streaming response message (what a Task's responder writes into)."""
    async with db.transaction() as tx:
        message = await open_message(
            tx,
            NewMessage(
                conversation_id=conversation_id,
                kind="harness",
                key="builtin",
                purpose="response",
                content=empty_model(),
                task_id=task_id,
                status="streaming",
            ),
        )
    return message.id


async def content_of(db: Database, message_id: str) -> dict[str, Any]:
    async with db.transaction(read_only=True) as tx:
        return (await tx.messages.get(message_id)).content


def without_call_ids(content: dict[str, Any]) -> dict[str, Any]:
    """Content with the gate blocks' ``call_id`` removed (it differs between two calls by design)."""
    blocks = [{k: v for k, v in b.items() if k != "call_id"} for b in content["blocks"]]
    return {**content, "blocks": blocks}


def block(content: dict[str, Any], block_id: str) -> dict[str, Any] | None:
    return next((b for b in content["blocks"] if b.get("id") == block_id), None)


async def answer_events(db: Database, message_id: str) -> list[tuple[str, str]]:
    """``(op, text)`` of every stored event that touches the answer block, in order (and the fold is checked)."""
    async with db.transaction(read_only=True) as tx:
        events = await tx.message_events.read(message_id, limit=1000)
        message = await tx.messages.get(message_id)
    assert fold(e.event for e in events).model.to_json() == message.content  # type: ignore[union-attr]
    found: list[tuple[str, str]] = []
    for stored in events:
        block: Any = stored.event.get("block")
        if isinstance(block, dict) and block.get("id") == "answer":
            found.append((str(stored.event["op"]), str(block.get("content"))))
    return found


def applied_in_order(events: list[tuple[str, str]]) -> str:
    text = ""
    for op, piece in events:
        text = piece if op == "set" else text + piece
    return text


def assert_append_only(events: list[tuple[str, str]], final: str) -> None:
    assert events and events[0][0] == "set", events
    assert all(op == "append" for op, _ in events[1:]), events  # no rewrite after the first set
    assert events[0][1] + "".join(piece for _, piece in events[1:]) == final, events


async def until(predicate: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, step: float = 0.02) -> None:
    """Check ``predicate`` until it holds, moving the test's virtual clock ``step`` seconds between checks (so
    polls, ticks and retries come due); ``timeout`` bounds the real time spent (a guard, not a measurement)."""
    if not _current:  # the test runs its engines on the system clock (a real model server streams in real time)
        await eventually(predicate, timeout=timeout)
        return
    async with asyncio.timeout(timeout):
        while not await predicate():
            # Real work (SQLite threads) gets a moment before virtual time moves on, so virtual time cannot run
            # far ahead of it on a busy machine and pass deadlines the test did not mean to reach.
            await asyncio.sleep(0.002)
            await _current[-1].advance(step)


async def until_true(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    async def check() -> bool:
        return predicate()

    await until(check, timeout=timeout)


async def until_done(engine: HarnessEngine, call_id: str, *, timeout: float = 10.0) -> HarnessCall:
    """The call once terminal, waiting with `until` (so an engine on the virtual clock keeps ticking)."""
    found: list[HarnessCall] = []

    async def ended() -> bool:
        found[:] = [await engine.get(call_id)]
        return found[0].is_terminal

    await until(ended, timeout=timeout)
    return found[0]


async def until_phase(engine: HarnessEngine, call_id: str, *phases: str, timeout: float = 10.0) -> HarnessCall:
    found: list[HarnessCall] = []

    async def reached() -> bool:
        call = await engine.get(call_id)
        found[:] = [call]
        return call.phase in phases

    await until(reached, timeout=timeout)
    return found[0]


# --- a scripted adapter ----------------------------------------------------------------------------------------


@dataclass
class ScriptedRun:
    """Yields its script; a ``None`` entry parks the run until ``release()`` is called."""

    adapter: ScriptedAdapter
    call_id: str
    script: list[Update | None]
    resumed: bool
    replays: bool = True
    released: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    gates: list[tuple[str, GateAnswer]] = field(default_factory=list)
    bursts: bool = False
    """Yield the script with no pause between items (a fast harness: the drive finds them queued together)."""

    @property
    def execution_ref(self) -> str | None:
        return self.call_id if self.adapter.names_runs_by_call else f"scripted/{self.call_id}"

    async def updates(self) -> AsyncIterator[Update]:
        self.adapter.active[self.call_id] = self.adapter.active.get(self.call_id, 0) + 1
        self.adapter.max_active = max(self.adapter.max_active, self.adapter.active[self.call_id])
        try:
            for item in self.script:
                if item is None:
                    await self.released.wait()
                    self.released.clear()
                    continue
                yield item
                if not self.bursts:
                    await asyncio.sleep(0)
            await asyncio.Event().wait()  # a harness that never says more (the engine must not hang on it)
        finally:
            self.adapter.active[self.call_id] -= 1

    def release(self) -> None:
        self.released.set()

    async def answer_gate(self, gate_id: str, answer: GateAnswer) -> None:
        self.gates.append((gate_id, answer))

    async def cancel(self) -> None:
        self.cancelled = True

    async def aclose(self) -> None:
        self.adapter.closed += 1


def _hello(_call_id: str) -> Sequence[Update | None]:
    return [TextPreview("Hel"), TextPreview("lo"), TextSet("Hello"), Finished("Hello")]


@dataclass
class ScriptedAdapter:
    """A harness whose every run plays ``script(call_id)``; records starts, resumes and runs."""

    script: Callable[[str], Sequence[Update | None]] = field(default_factory=lambda: _hello)
    supports_resume: bool = True
    replays: bool = True
    starts: list[str] = field(default_factory=list)
    resumes: list[str] = field(default_factory=list)
    runs: dict[str, list[ScriptedRun]] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    max_active: int = 0
    closed: int = 0
    names_runs_by_call: bool = False
    """Each run's execution ref is its call's id (as the built-in harness names its sessions), not one of its own."""
    bursts: bool = False
    """Its runs yield their scripts with no pause between items (`ScriptedRun.bursts`)."""

    @property
    def effect(self) -> tuple[EffectKind, Idempotency]:
        return EffectKind.WRITE, Idempotency.KEYED

    def _run(self, request: AdapterRequest, resumed: bool) -> ScriptedRun:
        script = list(self.script(request.call_id))
        run = ScriptedRun(self, request.call_id, script, resumed, replays=self.replays, bursts=self.bursts)
        self.runs.setdefault(request.call_id, []).append(run)
        return run

    async def start(self, request: AdapterRequest) -> ScriptedRun:
        self.starts.append(request.call_id)
        return self._run(request, False)

    async def resume(self, request: AdapterRequest, execution_ref: str | None) -> ScriptedRun:
        if not self.supports_resume:
            raise ResumeUnsupported("scripted: no resume")
        self.resumes.append(request.call_id)
        return self._run(request, True)

    def last_run(self, call_id: str) -> ScriptedRun:
        return self.runs[call_id][-1]


def scripted(*items: Update | None) -> Callable[[str], Sequence[Update | None]]:
    return lambda _call_id: list(items)


def make_engine(
    db: Database,
    adapters: dict[str, HarnessAdapter],
    *,
    replica_id: str = "replica-a",
    bus: ConversationBus | None = None,
    clock: VirtualClock | None = None,
    **options: Any,
) -> HarnessEngine:
    settings: dict[str, Any] = {"poll_interval": 0.05, "lease_ttl": 30.0, "retry_delay": 0.05, **options}
    return HarnessEngine(
        db,
        ledger=SqlLedgerStore(db),
        adapters=adapters,
        bus=bus or ConversationBus(),
        replica_id=replica_id,
        clock=clock,
        **settings,
    )
