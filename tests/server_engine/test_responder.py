"""The direct-harness responder end to end: a Task in the resource store, the reconcile Manager, the engine, and a
chat side built on storage + streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loopd.resources import NotFound as ResourceNotFound
from loopd.resources import open_sqlite_store
from loopd.resources.client import TASKS, StoreClient
from loopd.resources.reconcile import ControllerStatistics, Manager
from loopd.server.engine import Finished, HarnessEngine, TextSet
from loopd.server.responder import ChatPort, HarnessResponder
from loopd.server.storage import ConversationFork, Database, HarnessCall, Message, NewMessage
from loopd.server.streams import ConversationBus, empty_model, finish, open_message

from .conftest import ScriptedAdapter, make_engine, new_conversation, scripted, until, until_true

if TYPE_CHECKING:
    from loopd.server.chat import TaskApi

    def _task_api_is_a_chat_port(service: TaskApi) -> ChatPort:
        return service  # mypy checks that the real Task API satisfies the responder's port


@dataclass(frozen=True)
class Context:
    input: Message
    response: Message
    history: Sequence[Message]
    fork: ConversationFork | None = None
    conversation_mode: str | None = None
    has_earlier: bool = False


@dataclass
class StorageChat:
    """The two chat operations the responder needs, on storage and streams (not the real TaskApi)."""

    db: Database
    client: StoreClient
    bus: ConversationBus
    completed: list[tuple[str, Mapping[str, str] | None]] = field(default_factory=list)
    named: list[str | None] = field(default_factory=list)  # the response each completion was given
    contexts: list[str] = field(default_factory=list)
    history_limits: list[int | None] = field(default_factory=list)

    async def task_context(self, task_id: str, *, history: int | None = None) -> Context:
        self.contexts.append(task_id)
        self.history_limits.append(history)
        async with self.db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
            rows = await tx.messages.list_conversation(input_.conversation_id)
        through = [row for row in rows if row.id <= input_.id]
        kept = through if history is None else through[-history:]
        return Context(input_, response, kept, has_earlier=len(kept) < len(through))

    async def complete(
        self,
        task_id: str,
        *,
        error: Mapping[str, str] | None = None,
        response_id: str | None = None,
        later: bool = False,
    ) -> None:
        async with self.db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            await finish(tx, response.id, "failed" if error else "completed", error=error, bus=self.bus)
        with contextlib.suppress(ResourceNotFound):
            await self.client.delete(TASKS, task_id, namespace="default")
        self.completed.append((task_id, error))
        self.named.append(response_id)


@dataclass
class World:
    db: Database
    client: StoreClient
    chat: StorageChat
    engine: HarnessEngine
    adapter: ScriptedAdapter
    manager: Manager

    def responder(self) -> ControllerStatistics:
        (statistics,) = self.manager.statistics().controllers
        return statistics


@pytest.fixture
async def world(sqlite_db: Database, tmp_path: Path) -> AsyncIterator[World]:
    bus = ConversationBus()
    adapter = ScriptedAdapter(script=scripted(TextSet("It is 4."), Finished("It is 4.")))
    async with open_sqlite_store(tmp_path / "resources.db") as store:
        client = StoreClient(store)
        chat = StorageChat(sqlite_db, client, bus)
        async with make_engine(sqlite_db, {"assistant": adapter}, bus=bus) as engine:
            responder = HarnessResponder(client=client, engine=engine, chat=chat, poll=0.05, context_retry=0.05)
            manager = Manager(client)
            manager.add_controller(TASKS, responder, workers=2)
            running = asyncio.ensure_future(manager.run())
            try:
                yield World(sqlite_db, client, chat, engine, adapter, manager)
            finally:
                manager.shutdown()
                await asyncio.wait_for(running, 10)


def _task(task_id: str, key: str) -> dict[str, Any]:
    return {
        "apiVersion": TASKS.api_version,
        "kind": TASKS.kind,
        "metadata": {"name": task_id, "namespace": "default"},
        "spec": {"target": {"kind": "harness", "key": key}, "revision": 1},
    }


async def _question(db: Database, conversation: str, task_id: str, text: str, key: str) -> str:
    async with db.transaction() as tx:
        question = await open_message(
            tx,
            NewMessage(
                conversation_id=conversation,
                kind="user",
                key="alice",
                purpose="input",
                content={**empty_model(), "blocks": [{"id": "text", "type": "text", "content": text}]},
                task_id=task_id,
            ),
        )
        response = await open_message(
            tx,
            NewMessage(
                conversation_id=conversation,
                kind="harness",
                key=key,
                purpose="response",
                content=empty_model(),
                task_id=task_id,
                reply_to_message_id=question.id,
                status="streaming",
            ),
        )
    return response.id


async def _status(db: Database, message_id: str) -> str:
    async with db.transaction(read_only=True) as tx:
        return (await tx.messages.get(message_id)).status


async def _gone(client: StoreClient, task_id: str) -> bool:
    try:
        await client.get(TASKS, task_id, namespace="default")
    except ResourceNotFound:
        return True
    return False


async def test_a_harness_task_is_answered_and_completed(world: World) -> None:
    conversation = await new_conversation(world.db)
    await _question(world.db, conversation, "t-0", "what is 2+2?", "assistant")  # an earlier exchange …
    response = await _question(world.db, conversation, "t-1", "and 2+2 again?", "assistant")
    await world.client.create(TASKS, _task("t-1", "assistant"), namespace="default")

    await until(lambda: _gone(world.client, "t-1"))
    assert await _status(world.db, response) == "completed"
    assert world.chat.completed == [("t-1", None)]
    assert world.chat.named == [response]  # the call's message: the completion needs no lookup of it
    async with world.db.transaction(read_only=True) as tx:
        content = (await tx.messages.get(response)).content
    assert {b["id"] for b in content["blocks"]} == {"answer", "result"}
    calls = [await world.engine.get(call_id) for call_id in world.adapter.starts]
    (call,) = [c for c in calls if c.message_id == response]
    assert call.effect_key == "respond" and call.params["asker"] == "user:alice"
    assert call.params["text"] == "and 2+2 again?"
    assert [h["text"] for h in call.params["history"]] == ["what is 2+2?"]  # the earlier input, not this one


async def test_a_task_seen_before_its_messages_commit_is_retried(world: World) -> None:
    await world.client.create(TASKS, _task("t-2", "assistant"), namespace="default")
    # the responder sees the Task, finds no messages (the commit window) and requeues
    await until_true(lambda: world.responder().requeued >= 1)
    assert world.adapter.starts == []
    conversation = await new_conversation(world.db)
    response = await _question(world.db, conversation, "t-2", "late commit", "assistant")
    await until(lambda: _gone(world.client, "t-2"))
    assert await _status(world.db, response) == "completed"


async def test_a_task_for_an_unknown_harness_fails_with_that_error(world: World) -> None:
    conversation = await new_conversation(world.db)
    response = await _question(world.db, conversation, "t-3", "hello?", "nobody")
    await world.client.create(TASKS, _task("t-3", "nobody"), namespace="default")
    await until(lambda: _gone(world.client, "t-3"))
    assert await _status(world.db, response) == "failed"
    ((task_id, error),) = world.chat.completed
    assert task_id == "t-3" and error is not None and error["code"] == "unknown_target"


async def test_operator_tasks_are_left_alone(world: World) -> None:
    conversation = await new_conversation(world.db)
    response = await _question(world.db, conversation, "t-4", "route me", "router")
    operator_task = _task("t-4", "router")
    operator_task["spec"]["target"]["kind"] = "operator"
    await world.client.create(TASKS, operator_task, namespace="default")
    await until_true(lambda: world.responder().succeeded >= 1)  # reconciled: and left alone
    assert await _status(world.db, response) == "streaming" and world.chat.completed == []


async def test_an_orphan_task_whose_question_never_committed_is_deleted(world: World) -> None:
    """A crash between creating the Task and deleting it after a failed commit leaves a Task with no question."""
    from datetime import datetime, timedelta

    from loopd._infra.clock import VirtualClock
    from loopd.resources.reconcile import Request

    later = VirtualClock(wall_start=datetime.now(UTC) + timedelta(hours=1))
    responder = HarnessResponder(
        client=world.client, engine=world.engine, chat=world.chat, orphan_after=60, clock=later
    )
    try:
        await world.client.create(TASKS, _task("t-orphan", "assistant"), namespace="default")
        result = await responder.reconcile(Request(namespace="default", name="t-orphan"))
        assert result.requeue_after is None
        assert await _gone(world.client, "t-orphan")
        assert world.adapter.starts == []
        # A young Task without its question is the commit window: it is kept and retried.
        await world.client.create(TASKS, _task("t-young", "assistant"), namespace="default")
        young = HarnessResponder(client=world.client, engine=world.engine, chat=world.chat, orphan_after=60)
        try:
            assert (await young.reconcile(Request(namespace="default", name="t-young"))).requeue_after is not None
            assert not await _gone(world.client, "t-young")
        finally:
            young.close()
    finally:
        responder.close()


async def test_a_new_task_of_a_harness_that_takes_follow_ups_reads_its_context_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-over check and the start share one read of the Task's context (one read transaction per chat)."""
    monkeypatch.setattr(ScriptedAdapter, "supports_inputs", True, raising=False)
    assert world.engine.takes_inputs("assistant")
    conversation = await new_conversation(world.db)
    response = await _question(world.db, conversation, "t-once", "hello", "assistant")
    await world.client.create(TASKS, _task("t-once", "assistant"), namespace="default")
    await until(lambda: _gone(world.client, "t-once"))
    assert await _status(world.db, response) == "completed"
    assert world.chat.contexts.count("t-once") == 1


@dataclass
class Responding:
    """A responder with a store of its own: its client, the status writes it made and the Task reads (names)."""

    client: StoreClient
    responder: HarnessResponder
    manager: Manager
    writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    engine: HarnessEngine | None = None
    chat: StorageChat | None = None

    def controller(self) -> ControllerStatistics:
        (statistics,) = self.manager.statistics().controllers
        return statistics


@contextlib.asynccontextmanager
async def _responding(
    db: Database, tmp_path: Path, adapter: ScriptedAdapter, **options: Any
) -> AsyncIterator[Responding]:
    """A responder with ``options``, wired as the server wires it (its event filter), on a store of its own."""
    bus = ConversationBus()
    async with open_sqlite_store(tmp_path / "statuses.db") as store:
        client = StoreClient(store)
        original_patch, original_get = client.patch, client.get
        writes: list[tuple[str, dict[str, Any]]] = []
        reads: list[str] = []

        async def patch(*args: Any, **kwargs: Any) -> dict[str, Any]:
            if kwargs.get("subresource") == "status":
                writes.append((args[1], dict(args[2]["status"])))
            return await original_patch(*args, **kwargs)

        async def get(*args: Any, **kwargs: Any) -> dict[str, Any]:
            reads.append(args[1])
            return await original_get(*args, **kwargs)

        client.patch = patch  # type: ignore[method-assign]
        client.get = get  # type: ignore[method-assign]
        chat = StorageChat(db, client, bus)
        async with make_engine(db, {"assistant": adapter}, bus=bus) as engine:
            responder = HarnessResponder(client=client, engine=engine, chat=chat, poll=0.05, **options)
            manager = Manager(client)
            manager.add_controller(TASKS, responder, workers=2, event_filter=responder.event_filter)
            running = asyncio.ensure_future(manager.run())
            try:
                yield Responding(client, responder, manager, writes, reads, engine, chat)
            finally:
                manager.shutdown()
                await asyncio.wait_for(running, 10)


async def _ask(it: Responding, db: Database, task_id: str, text: str) -> str:
    """A question in a new conversation and its Task, for the responder of ``it``; the response message's id."""
    conversation = await new_conversation(db)
    response = await _question(db, conversation, task_id, text, "assistant")
    await it.client.create(TASKS, _task(task_id, "assistant"), namespace="default")
    return response


async def test_a_task_answered_before_its_status_is_due_never_gets_one(sqlite_db: Database, tmp_path: Path) -> None:
    # Completing deletes the Task: a status written just before that is a resource write (and watch events) that
    # nobody could see. Quick answers (the call ends within report_after) get none.
    adapter = ScriptedAdapter(script=scripted(TextSet("It is 4."), Finished("It is 4.")))
    async with _responding(sqlite_db, tmp_path, adapter, report_after=60.0) as it:
        response = await _ask(it, sqlite_db, "t-quick", "2+2?")
        await until(lambda: _gone(it.client, "t-quick"))
    assert await _status(sqlite_db, response) == "completed"
    assert it.writes == []


async def test_a_task_whose_call_runs_on_is_reported_running_once_its_status_is_due(
    sqlite_db: Database, tmp_path: Path
) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("working"), None, Finished("done")))  # parks after the text
    async with _responding(sqlite_db, tmp_path, adapter, report_after=0.3) as it:
        client, writes = it.client, it.writes
        await _ask(it, sqlite_db, "t-long", "take your time")
        await until_true(lambda: len(adapter.starts) == 1)
        await asyncio.sleep(0.1)
        assert writes == []  # running, but not yet held for report_after
        await until_true(lambda: len(writes) == 1)
        ((name, status),) = writes
        assert name == "t-long" and status["phase"] == "Running" and status["responder"] == "harness:assistant"
        (call_id,) = adapter.starts
        call = await adapter_call(sqlite_db, call_id)
        started = datetime.fromisoformat(status["startedAt"].replace("Z", "+00:00"))
        assert abs((started - call.created_at).total_seconds()) < 1.0  # since when its call runs (whole seconds)
        await asyncio.sleep(0.2)
        assert len(writes) == 1  # unchanged since: not written again
        adapter.last_run(call_id).release()
        await until(lambda: _gone(client, "t-long"))
    assert len(writes) == 1


async def test_a_task_completed_here_is_not_read_again_after_its_deletion(sqlite_db: Database, tmp_path: Path) -> None:
    # Its deletion (a watch event) and the timer its call set (poll) used to reconcile it once more each, only to
    # read that it is gone. Neither reads now: the deletion is filtered, the timer finds it completed here.
    adapter = ScriptedAdapter(script=scripted(TextSet("It is 4."), Finished("It is 4.")))
    async with _responding(sqlite_db, tmp_path, adapter, report_after=60.0) as it:
        response = await _ask(it, sqlite_db, "t-done", "2+2?")
        await until_true(lambda: it.responder.statistics().following == 0)
        await until(lambda: _gone(it.client, "t-done"))
        reads_when_gone = it.reads.count("t-done")  # the checks above
        await asyncio.sleep(0.3)  # the call's timer (0.05 s) and the deletion's event have come and gone
        assert it.reads.count("t-done") == reads_when_gone
        assert it.controller().filtered >= 1  # the deletion
        assert it.responder.statistics().following == 0
    assert await _status(sqlite_db, response) == "completed"


async def test_a_reconcile_takes_the_task_from_the_controllers_cache(sqlite_db: Database, tmp_path: Path) -> None:
    # The informer holds the Task (the event that queued a reconcile is applied to its cache first): answering it
    # reads it from the API not once — on a cluster each of those reads was a request to the API server.
    adapter = ScriptedAdapter(script=scripted(TextSet("It is 4."), Finished("It is 4.")))
    async with _responding(sqlite_db, tmp_path, adapter, report_after=60.0) as it:
        response = await _ask(it, sqlite_db, "t-cached", "2+2?")
        await until(lambda: _completed(sqlite_db, response))
        await until_true(lambda: it.responder.statistics().following == 0)
        assert it.reads.count("t-cached") == 0
        assert len(adapter.starts) == 1


async def _completed(db: Database, response: str) -> bool:
    return await _status(db, response) == "completed"


async def test_a_task_created_again_under_a_completed_name_is_reconciled(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("It is 4."), Finished("It is 4.")))
    async with _responding(sqlite_db, tmp_path, adapter, report_after=60.0) as it:
        await _ask(it, sqlite_db, "t-again", "2+2?")
        await until(lambda: _gone(it.client, "t-again"))
        await asyncio.sleep(0.1)
        # A new Task of that name (its answer is stored already): reconciled, found answered, completed — deleted.
        await it.client.create(TASKS, _task("t-again", "assistant"), namespace="default")
        await until(lambda: _gone(it.client, "t-again"))
    assert len(adapter.starts) == 1


async def test_a_deleted_task_is_let_go_without_a_reconcile(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("working"), None, Finished("done")))  # parks after the text
    async with _responding(sqlite_db, tmp_path, adapter, report_after=60.0) as it:
        await _ask(it, sqlite_db, "t-cancel", "take your time")
        await until_true(lambda: len(adapter.starts) == 1 and it.responder.statistics().following == 1)
        await it.client.delete(TASKS, "t-cancel", namespace="default")
        await until_true(lambda: it.responder.statistics().following == 0)  # dropped by the deletion's event
        assert it.controller().filtered >= 1
        (call_id,) = adapter.starts
        adapter.last_run(call_id).release()


async def adapter_call(db: Database, call_id: str) -> HarnessCall:
    async with db.transaction(read_only=True) as tx:
        return await tx.harness_calls.get(call_id)
