"""Engine notices and the responder's wake-ups: a finished call or a freed slot queues its Task at once.

The responders here poll once every ten minutes, so a Task that completes within a test's time was woken by
the engine's notice, never by the poll.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest

import loopd.server._composition as composition
from loopd.resources import open_sqlite_store
from loopd.resources.client import TASKS, StoreClient
from loopd.resources.reconcile import Manager
from loopd.server._composition import UpSettings, open_loop_server
from loopd.server.chat import QuestionWindow
from loopd.server.engine import CallRequest, Finished, TextSet
from loopd.server.engine._engine import MAX_LISTENERS, EngineNotice
from loopd.server.responder import HarnessResponder
from loopd.server.storage import Database, HarnessCall
from loopd.server.streams import ConversationBus

from .conftest import ScriptedAdapter, make_engine, new_conversation, scripted, until, until_phase, until_true
from .test_responder import StorageChat, World, _gone, _question, _status, _task

NEVER: float = 600.0  # a poll that never comes within a test


# --- the engine's notices --------------------------------------------------------------------------------------


def _request(conversation_id: str, key: str) -> CallRequest:
    return CallRequest(
        owner_uid="uid-1",
        effect_key=key,
        target="scripted",
        text="hi",
        conversation_id=conversation_id,
        asker="user:alice",
        timeout=3600,  # virtual seconds: `until` moves the clock while real work runs; the deadline is not under test
    )


async def test_a_finished_call_is_announced_after_it_is_terminal(sqlite_db: Database) -> None:
    engine = make_engine(sqlite_db, {"scripted": ScriptedAdapter()}, capacity=2)
    notices: list[EngineNotice] = []
    reads: list[asyncio.Future[HarnessCall]] = []

    def listen(notice: EngineNotice) -> None:
        notices.append(notice)
        if notice.ended:  # read at once: what a woken reconciler would see
            reads.append(asyncio.ensure_future(engine.get(notice.call_id)))

    remove = engine.add_listener(listen)
    async with engine:
        conversation = await new_conversation(sqlite_db)
        call = await engine.start(_request(conversation, "work/1"))
        await until_true(lambda: _ended(notices, call.id))
        ended = next(n for n in notices if n.ended)
        assert (ended.call_id, ended.owner_uid, ended.effect_key) == (call.id, "uid-1", "work/1")
        assert ended.free_slots == 2  # its slot is free again
        assert ended.call is not None and (ended.call.id, ended.call.phase) == (call.id, "succeeded")
        assert all(n.call is None for n in notices if not n.ended)  # only an end carries the call
        (read,) = reads
        assert (await read).phase == "succeeded"  # committed before the notice went out
        remove()
        other = await engine.start(_request(conversation, "work/2"))
        await until_phase(engine, other.id, "succeeded")
        await until_true(lambda: engine.statistics().driving == 0)  # its drive ended: any notice went out
        assert not any(n.call_id == other.id for n in notices)  # removed: nothing more


def _ended(notices: list[EngineNotice], call_id: str) -> bool:
    return any(n.ended and n.call_id == call_id for n in notices)


async def test_a_failing_listener_is_logged_and_the_others_still_hear(
    sqlite_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(sqlite_db, {"scripted": ScriptedAdapter()})
    heard: list[EngineNotice] = []

    def broken(_notice: EngineNotice) -> None:
        raise RuntimeError("listener bug")

    engine.add_listener(broken)
    engine.add_listener(heard.append)
    with caplog.at_level(logging.ERROR, logger="loopd.server.engine"):
        async with engine:
            conversation = await new_conversation(sqlite_db)
            call = await engine.start(_request(conversation, "work/1"))
            await until_true(lambda: _ended(heard, call.id))
            assert (await engine.get(call.id)).phase == "succeeded"  # the drive was not disturbed
    assert any("a listener failed" in record.message for record in caplog.records)


def test_listeners_are_bounded(sqlite_db: Database) -> None:
    engine = make_engine(sqlite_db, {})
    for _ in range(MAX_LISTENERS):
        engine.add_listener(lambda _notice: None)
    with pytest.raises(ValueError, match="at most"):
        engine.add_listener(lambda _notice: None)


# --- the responder ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def _world(
    db: Database,
    tmp_path: Path,
    adapter: ScriptedAdapter,
    *,
    capacity: int,
    questions: QuestionWindow | None = None,
    context_retry: float = 0.05,
    capacity_retry: float = NEVER,
    report_after: float | None = None,
) -> AsyncIterator[tuple[World, HarnessResponder]]:
    bus = ConversationBus()
    async with open_sqlite_store(tmp_path / "resources.db") as store:
        client = StoreClient(store)
        chat = StorageChat(db, client, bus)
        async with make_engine(db, {"assistant": adapter}, bus=bus, capacity=capacity) as engine:
            responder = HarnessResponder(
                client=client,
                engine=engine,
                chat=chat,
                poll=NEVER,
                capacity_retry=capacity_retry,
                context_retry=context_retry,
                questions=questions,
                **({} if report_after is None else {"report_after": report_after}),
            )
            manager = Manager(client)
            manager.add_controller(TASKS, responder, workers=4)
            running = asyncio.ensure_future(manager.run())
            try:
                yield World(db, client, chat, engine, adapter, manager), responder
            finally:
                manager.shutdown()
                await asyncio.wait_for(running, 10)
                responder.close()


async def test_a_finished_call_completes_its_task_through_the_notice(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("4"), Finished("4")))
    async with _world(sqlite_db, tmp_path, adapter, capacity=10) as (world, responder):
        conversation = await new_conversation(world.db)
        response = await _question(world.db, conversation, "t-1", "2+2?", "assistant")
        await world.client.create(TASKS, _task("t-1", "assistant"), namespace="default")
        await until(lambda: _gone(world.client, "t-1"))
        assert await _status(world.db, response) == "completed"
        statistics = responder.statistics()
        assert statistics.call_ended_wakes == 1
        assert (statistics.following, statistics.waiting_for_capacity) == (0, 0)  # nothing held after completion


async def test_a_task_whose_question_is_being_stored_waits_for_the_commit_without_reading(
    sqlite_db: Database, tmp_path: Path
) -> None:
    # The chat creates the Task inside the question's transaction, so its watch event usually comes first. With the
    # window open the responder reads nothing and sets the Task aside; the window's close queues it again. The
    # context retry never comes within the test, so only that wake-up can answer the Task.
    window = QuestionWindow()
    adapter = ScriptedAdapter(script=scripted(TextSet("4"), Finished("4")))
    async with _world(sqlite_db, tmp_path, adapter, capacity=10, questions=window, context_retry=NEVER) as (
        world,
        responder,
    ):
        gets: list[str] = []
        get = world.client.get

        async def counted(kind: Any, name: str, **options: Any) -> Any:
            gets.append(name)
            return await get(kind, name, **options)

        world.client.get = counted  # type: ignore[method-assign,assignment]
        finds: list[str] = []
        find = world.engine.find

        async def found(owner_uid: str, effect_key: str) -> Any:
            finds.append(owner_uid)
            return await find(owner_uid, effect_key)

        world.engine.find = found  # type: ignore[method-assign]
        conversation = await new_conversation(world.db)
        window.open("t-1")
        await world.client.create(TASKS, _task("t-1", "assistant"), namespace="default")

        def set_aside() -> bool:
            return world.responder().reconciles >= 1

        await until_true(set_aside)
        assert gets == [] and world.chat.contexts == []  # nothing read while the question is not stored
        response = await _question(world.db, conversation, "t-1", "2+2?", "assistant")
        window.close("t-1")  # the commit
        await until(lambda: _gone(world.client, "t-1"))
        assert await _status(world.db, response) == "completed"
        assert world.chat.contexts == ["t-1"]  # read once, after the commit
        # Asked a moment ago, it can have no call yet: the start after the close looks for none (its admission
        # would find one); the completion, woken by the call's end, takes the ended call from the notice.
        assert finds == []
        window.close("t-1")  # closing again tells nobody
        assert responder.statistics().following == 0


async def test_a_context_handed_over_by_its_question_is_started_without_a_read(
    sqlite_db: Database, tmp_path: Path
) -> None:
    """A conversation's first question leaves its Task's context with the window as it commits: the responder's
    reconcile after the close takes it and starts the call without reading the context back."""
    window = QuestionWindow()
    adapter = ScriptedAdapter(script=scripted(TextSet("4"), Finished("4")))
    async with _world(sqlite_db, tmp_path, adapter, capacity=10, questions=window, context_retry=NEVER) as (
        world,
        _responder,
    ):
        conversation = await new_conversation(world.db)
        window.open("t-1")
        await world.client.create(TASKS, _task("t-1", "assistant"), namespace="default")
        response = await _question(world.db, conversation, "t-1", "2+2?", "assistant")
        context = _Handed("t-1", await world.chat.task_context("t-1"))
        world.chat.contexts.clear()
        window.hand_over(context)  # type: ignore[arg-type]  # what the question's transaction knows
        window.close("t-1")  # the commit
        await until(lambda: _gone(world.client, "t-1"))
        assert await _status(world.db, response) == "completed"
        assert world.chat.contexts == []  # started from the hand-over: nothing read
        assert window.handed_over("t-1") is None  # taken


class _Handed:
    """A test context as a question hands it over (its Task's id with it)."""

    def __init__(self, task_id: str, context: Any) -> None:
        self.task_id = task_id
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def test_a_question_window_tells_its_listeners_once_per_close() -> None:
    window = QuestionWindow()
    heard: list[str] = []
    stop = window.listen(heard.append)
    window.close("never-opened")
    window.open("t-1")
    assert window.is_open("t-1") and not window.is_open("t-2")
    window.close("t-1")
    window.close("t-1")
    assert heard == ["t-1"] and not window.is_open("t-1")
    stop()
    stop()  # twice is harmless
    window.open("t-2")
    window.close("t-2")
    assert heard == ["t-1"]


async def _release_until_gone(world: World, adapter: ScriptedAdapter, names: list[str]) -> None:
    """Release every parked run (again and again: calls start as slots free) until the Tasks ``names`` are gone."""

    async def all_done() -> bool:
        for runs in adapter.runs.values():
            for run in runs:
                run.release()
        return all([await _gone(world.client, name) for name in names])

    await until(all_done)


async def test_tasks_refused_for_capacity_start_as_slots_free(sqlite_db: Database, tmp_path: Path) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("ok"), None, Finished("ok")))  # each run waits for release
    async with _world(sqlite_db, tmp_path, adapter, capacity=1) as (world, responder):
        starts: list[str] = []  # every start the responder asked the engine for
        start = world.engine.start

        async def counted(request: CallRequest) -> HarnessCall:
            starts.append(request.owner_uid)
            return await start(request)

        world.engine.start = counted  # type: ignore[method-assign]
        conversation = await new_conversation(world.db)
        names = [f"t-{index}" for index in range(3)]
        responses = [await _question(world.db, conversation, name, "hello", "assistant") for name in names]
        await world.client.create(TASKS, _task(names[0], "assistant"), namespace="default")

        async def first_running() -> bool:
            return len(adapter.starts) == 1

        await until(first_running)  # the one slot is taken
        for name in names[1:]:
            await world.client.create(TASKS, _task(name, "assistant"), namespace="default")

        async def two_refused() -> bool:
            return responder.statistics().waiting_for_capacity == 2

        await until(two_refused)
        # With every slot taken the two others wait without asking the engine (whose start would only be refused
        # inside a write transaction).
        assert len(starts) == 1

        await _release_until_gone(world, adapter, names)
        assert [await _status(world.db, response) for response in responses] == ["completed"] * 3
        assert len(adapter.starts) == 3 and adapter.max_active == 1
        statistics = responder.statistics()
        assert statistics.woken >= 2 + 3  # two slot wake-ups, three call ends
        assert (statistics.following, statistics.waiting_for_capacity) == (0, 0)


@pytest.mark.parametrize("report_after", [0.0, 0.2], ids=["pending-at-once", "pending-later"])
async def test_retries_of_tasks_waiting_only_for_a_slot_read_nothing(
    sqlite_db: Database, tmp_path: Path, report_after: float
) -> None:
    # One slot, held by the first call; two more Tasks wait for it, each in a conversation of its own (no earlier
    # answer there could take its input). Their capacity retries come every 20 ms: they neither read its context
    # again nor ask the engine while the slot stays taken — under a burst of a thousand chats, that was most of the
    # responder's work. Pending is said once a Task has waited `report_after` (at its first refusal, or later from
    # the Task alone: the context was read on every retry until then). The slot's notice still starts them.
    adapter = ScriptedAdapter(script=scripted(TextSet("ok"), None, Finished("ok")))  # each run waits for release
    async with _world(sqlite_db, tmp_path, adapter, capacity=1, capacity_retry=0.02, report_after=report_after) as (
        world,
        responder,
    ):
        names = [f"t-{index}" for index in range(3)]
        responses = [
            await _question(world.db, await new_conversation(world.db), name, "hello", "assistant") for name in names
        ]
        await world.client.create(TASKS, _task(names[0], "assistant"), namespace="default")

        async def first_running() -> bool:
            return len(adapter.starts) == 1

        await until(first_running)
        for name in names[1:]:
            await world.client.create(TASKS, _task(name, "assistant"), namespace="default")

        async def said_pending() -> bool:
            for name in names[1:]:
                task = await world.client.get(TASKS, name, namespace="default")
                if (task.get("status") or {}).get("phase") != "Pending":
                    return False
            return True

        await until(said_pending)
        idle = responder.statistics().idle_retries
        await until_true(lambda: responder.statistics().idle_retries >= idle + 10)  # quiet from then on
        assert [world.chat.contexts.count(name) for name in names[1:]] == [1, 1]  # read once, at their first refusal
        assert responder.statistics().waiting_for_capacity == 2

        await _release_until_gone(world, adapter, names)
        assert [await _status(world.db, response) for response in responses] == ["completed"] * 3
        assert len(adapter.starts) == 3 and adapter.max_active == 1
        statistics = responder.statistics()
        assert (statistics.following, statistics.waiting_for_capacity) == (0, 0)


async def test_a_waiting_follow_up_keeps_looking_for_the_earlier_answer_to_join(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follow-up whose earlier answer in the conversation still streams may be handed to that answer's call once
    # it runs — which a retry finds out, not a slot: its retries keep reading, while its conversation's first
    # question (no earlier answer) waits quietly for the slot.
    monkeypatch.setattr(ScriptedAdapter, "supports_inputs", True, raising=False)
    adapter = ScriptedAdapter(script=scripted(TextSet("ok"), None, Finished("ok")))
    async with _world(sqlite_db, tmp_path, adapter, capacity=1, capacity_retry=0.02, report_after=0.0) as (
        world,
        responder,
    ):
        other, conversation = await new_conversation(world.db), await new_conversation(world.db)
        responses = [await _question(world.db, other, "t-x", "hello", "assistant")]
        await world.client.create(TASKS, _task("t-x", "assistant"), namespace="default")

        async def first_running() -> bool:
            return len(adapter.starts) == 1

        await until(first_running)
        for name in ("t-a", "t-b"):  # the question, then its follow-up, in one conversation
            responses.append(await _question(world.db, conversation, name, "hello", "assistant"))
            await world.client.create(TASKS, _task(name, "assistant"), namespace="default")
        await until_true(lambda: responder.statistics().idle_retries >= 10 and world.chat.contexts.count("t-b") >= 3)
        assert world.chat.contexts.count("t-a") == 1

        await _release_until_gone(world, adapter, ["t-x", "t-a", "t-b"])
        assert [await _status(world.db, response) for response in responses] == ["completed"] * 3


# --- the whole server ------------------------------------------------------------------------------------------


class _PatientResponder(HarnessResponder):
    """The composition's responder, with polls that never come within the test (instances are recorded)."""

    made: list[HarnessResponder] = []

    def __init__(self, **options: Any) -> None:
        super().__init__(**{**options, "poll": NEVER, "capacity_retry": NEVER})
        self.made.append(self)


async def test_a_chat_to_the_builtin_harness_completes_through_the_notice(tmp_path: Path) -> None:
    _PatientResponder.made = []
    settings = UpSettings(data_dir=tmp_path / "data", port=0)
    with mock.patch.object(composition, "HarnessResponder", _PatientResponder):
        async with open_loop_server(settings) as server:
            token = server.token_file.read_text().strip()
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15
            ) as client:
                conversation = (await client.post("/v1/conversations", json={"name": "quick"})).json()["id"]
                body = {"target": {"kind": "harness", "key": "assistant"}, "text": "hello"}
                ops: list[str] = []
                async with (
                    asyncio.timeout(30),
                    client.stream(
                        "POST",
                        f"/v1/conversations/{conversation}/messages",
                        json=body,
                        headers={"Accept": "text/event-stream"},
                    ) as response,
                ):
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if line.startswith("data:") and '"op":"end"' in line and '"purpose":"response"' in line:
                            ops.append("end")
                            break
                assert ops == ["end"]  # the stream ended with the response's end, long before any poll
    (responder,) = _PatientResponder.made
    statistics = responder.statistics()
    assert statistics.call_ended_wakes == 1 and statistics.following == 0
