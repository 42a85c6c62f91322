"""Driving calls through an adapter: projection, phases, deadlines, cancel, waits, streams, replays (SQLite)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd._infra.clock import VirtualClock
from loopd.agentue import fold
from loopd.harness.models import ModelChunk, ModelRequest, RecordingModel, ReplyInfo, TextDelta
from loopd.server.engine import (
    AdapterRequest,
    CallRequest,
    Failed,
    Finished,
    GateForbidden,
    GateOpened,
    GateResolved,
    ModelCalled,
    TextPreview,
    TextSet,
    ToolFinished,
    ToolStarted,
    Update,
)
from loopd.server.engine._driving import PREVIEW_GATHER, PREVIEW_GATHER_MAX, Drive, LiveText, gather_wait
from loopd.server.ledger import Actor, Lane, Scope, SqlLedgerStore, UnresolvedAttempt
from loopd.server.storage import Conflict, Database, Message, NotFound
from loopd.server.storage._harness_calls import HarnessCalls
from loopd.server.streams import ConversationBus

from .conftest import (
    ScriptedAdapter,
    ScriptedRun,
    block,
    content_of,
    make_engine,
    new_conversation,
    new_response,
    scripted,
    until,
    until_phase,
    until_true,
)


async def start(db: Database, engine: object, *, timeout: float = 60.0, key: str = "respond") -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(  # type: ignore[attr-defined]
        CallRequest("task-uid", key, "scripted", "question", message_id=response, asker="user:alice", timeout=timeout)
    )
    return call.id, response


async def test_a_call_is_projected_into_its_message_and_traced(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter(
        script=scripted(
            TextPreview("Let me "),
            TextPreview("look."),
            ModelCalled("m", input_tokens=10, output_tokens=5, cost_usd=0.25),
            TextSet("Let me look."),
            ToolStarted("c1", "echo", {"text": "x"}),
            ToolFinished("c1", "echo", "completed", "x"),
            ModelCalled("m", input_tokens=20, output_tokens=7, cost_usd=0.5),
            TextSet("Let me look.\n\nDone."),
            Finished("Done."),
        )
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        call = await engine.wait(call_id, 10)
    assert call.phase == "succeeded"
    assert call.result == {"format": "text", "content": "Done."}
    assert call.checkpoint == 7  # durable updates only; previews are not counted
    content = await content_of(sqlite_db, response)
    assert block(content, "answer") == {"id": "answer", "type": "text", "content": "Let me look.\n\nDone."}
    assert block(content, "tool/c1") == {
        "id": "tool/c1",
        "type": "tool",
        "name": "echo",
        "input": {"text": "x"},
        "status": "completed",
        "output": "x",
    }
    assert block(content, "result") == {"id": "result", "type": "result", "format": "text", "content": "Done."}
    async with sqlite_db.transaction(read_only=True) as tx:
        message = await tx.messages.get(response)
        events = await tx.message_events.read(response)
    assert message.status == "streaming"  # the owner finishes the message, not the engine
    assert fold(e.event for e in events).model.to_json() == content  # type: ignore[union-attr]

    ledger = sqlite_db
    from loopd.server.ledger import SqlLedgerStore

    store = SqlLedgerStore(ledger)
    usage = await store.usage(Scope(harness_call_id=call_id))
    assert (usage.input_tokens, usage.output_tokens, usage.cost_usd) == (30, 12, 0.75)
    by_task = await store.usage(Scope(task_id="task-1"))
    assert by_task.input_tokens == 30
    view = await engine.trail(call_id)
    kinds = [e.event_type for e in view.events]
    assert kinds[:4] == ["run.started", "turn.started", "action.started", "attempt.requested"]
    assert kinds[-1] == "run.completed"
    assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []
    assert [lane.run_id for lane in view.lanes] == [call_id]


async def test_a_gate_waits_for_input_and_the_answer_reaches_the_harness(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter(
        script=scripted(GateOpened("t/1", "- write a.txt"), None, GateResolved("t/1", "always", True), Finished("ok"))
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "waiting_input")
        gate = block(await content_of(sqlite_db, response), "gate/t/1")
        assert gate is not None and gate["status"] == "pending" and gate["type"] == "ask"
        assert [c["value"] for c in gate["choices"]] == ["approve", "always", "deny"]
        with pytest.raises(GateForbidden):
            await engine.answer_gate(call_id, "t/1", "approve", "user:mallory")
        with pytest.raises(NotFound):
            await engine.answer_gate(call_id, "t/2", "approve", "user:alice")
        await engine.answer_gate(call_id, "t/1", "always", "user:alice")
        await engine.answer_gate(call_id, "t/1", "always", "user:alice")  # the same answer again is fine
        with pytest.raises(Conflict):
            await engine.answer_gate(call_id, "t/1", "deny", "user:alice")  # one answer binds
        run = adapter.last_run(call_id)
        await until_true(lambda: bool(run.gates))
        assert run.gates == [("t/1", "always")]
        run.release()
        call = await engine.wait(call_id, 10)
    assert call.phase == "succeeded"
    gate = block(await content_of(sqlite_db, response), "gate/t/1")
    assert gate is not None and (gate["status"], gate["value"]) == ("success", "always")


async def test_the_watcher_reads_the_content_only_while_an_answer_may_be_there(
    sqlite_db: Database, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopd.server.storage import _messages

    reads: list[str] = []
    original = _messages.Messages.get

    async def counting(self: _messages.Messages, message_id: str) -> Message:
        reads.append(message_id)
        return await original(self, message_id)

    monkeypatch.setattr(_messages.Messages, "get", counting)
    adapter = ScriptedAdapter(
        script=scripted(TextSet("working"), None, GateOpened("t/1", "- write a.txt"), None, Finished("ok"))
    )
    async with make_engine(sqlite_db, {"scripted": adapter}, clock=clock) as engine:  # a look every 0.05 s
        call_id, response = await start(sqlite_db, engine)
        await until(lambda: _checkpoint(engine, call_id, 1))
        started = reads.count(response)  # the start's and the drive's own reads
        looks = 0

        async def look() -> None:
            nonlocal looks
            for _ in range(10):
                await clock.advance(0.05)
                await asyncio.sleep(0.01)  # the look's own storage work (real time)
                looks += 1

        await look()  # ~10 looks with nothing to answer: at most the first reads the content
        assert reads.count(response) - started <= 1
        before = reads.count(response)
        adapter.last_run(call_id).release()
        await until_phase(engine, call_id, "waiting_input")  # the gate is open: looks read the content again
        await engine.answer_gate(call_id, "t/1", "approve", "user:alice")
        run = adapter.last_run(call_id)
        await until_true(lambda: bool(run.gates))
        assert run.gates == [("t/1", "approve")] and reads.count(response) > before
        await look()  # answered and forwarded: nothing pending, so no more content reads
        settled = reads.count(response)
        await look()
        assert reads.count(response) == settled and looks == 30
        run.release()
        call = await engine.wait(call_id, 10)
    assert call.phase == "succeeded"


async def test_the_deadline_times_a_call_out(sqlite_db: Database, clock: VirtualClock) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("working"), None))
    async with make_engine(sqlite_db, {"scripted": adapter}, clock=clock) as engine:
        call_id, _ = await start(sqlite_db, engine, timeout=10)
        await until(lambda: _checkpoint(engine, call_id, 1))
        await clock.advance(11)
        call = await until_phase(engine, call_id, "timed_out")
    assert call.error is not None and call.error["code"] == "timed_out"
    assert adapter.last_run(call_id).cancelled
    view = await engine.trail(call_id)
    assert view.events[-1].event_type == "run.failed"


async def _checkpoint(engine: object, call_id: str, at_least: int) -> bool:
    return (await engine.get(call_id)).checkpoint >= at_least  # type: ignore[attr-defined, no-any-return]


async def test_a_run_named_by_its_call_goes_running_with_its_first_write(
    sqlite_db: Database, clock: VirtualClock
) -> None:
    """A run whose execution ref is the call's own id tells a resume nothing new: no transaction stores it before
    the run says something; its first live text moves the call to running (with the ref), in the same write. A run
    with a ref of its own has it stored at once (the other tests here wait for running while their run is parked)."""
    adapter = ScriptedAdapter(
        script=scripted(None, TextPreview("Hel"), None, TextSet("Hello"), Finished("Hello")), names_runs_by_call=True
    )
    async with make_engine(sqlite_db, {"scripted": adapter}, clock=clock) as engine:
        call_id, _ = await start(sqlite_db, engine)
        await until(lambda: _active(adapter, call_id))  # the run started and waits before its first update
        parked = await engine.get(call_id)
        assert (parked.phase, parked.execution_ref) == ("starting", None)
        adapter.last_run(call_id).release()
        running = await until_phase(engine, call_id, "running")
        assert running.execution_ref == call_id
        adapter.last_run(call_id).release()
        done = await until_phase(engine, call_id, "succeeded")
    assert done.execution_ref == call_id


async def _active(adapter: ScriptedAdapter, call_id: str) -> bool:
    return adapter.active.get(call_id, 0) == 1


async def test_cancel_stops_the_execution_and_a_wait_never_cancels(sqlite_db: Database, clock: VirtualClock) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("working"), None))
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, _ = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "running")  # the driver has it (it may still be pending right after start)
        waiting = asyncio.ensure_future(engine.wait(call_id, 0.2))
        await clock.advance(0.2)  # the wait's timeout passes on the engine's (the database's) clock
        waited = await waiting
        assert not waited.is_terminal
        assert (await engine.get(call_id)).phase == "running"
        requested = await engine.cancel(call_id)
        assert requested.cancel_requested
        call = await until_phase(engine, call_id, "cancelled")
        again = await engine.cancel(call_id)  # idempotent on a terminal call
    assert again.phase == "cancelled" and call.error is not None
    assert adapter.last_run(call_id).cancelled
    assert (await engine.trail(call_id)).events[-1].event_type == "run.cancelled"


async def test_a_call_cancelled_before_anyone_drove_it_never_starts(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter()
    engine = make_engine(sqlite_db, {"scripted": adapter})
    call_id, _ = await start(sqlite_db, engine)
    await engine.cancel(call_id)
    async with engine:
        call = await until_phase(engine, call_id, "cancelled")
    assert adapter.starts == [] and call.error == {"code": "cancelled", "message": "the call was cancelled"}


async def test_the_stream_serves_the_visible_events_from_any_seq(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter(script=scripted(TextPreview("Hi"), None, TextSet("Hi!"), Finished("Hi!")))
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, _ = await start(sqlite_db, engine)
        seen: list[int] = []

        async def read_all() -> None:
            async for event in engine.stream(call_id):
                seen.append(event.seq)

        reader = asyncio.ensure_future(read_all())
        await until_true(lambda: len(seen) >= 2)  # start + the preview, while the call still runs
        adapter.last_run(call_id).release()
        await asyncio.wait_for(reader, 10)
        later = [event.seq async for event in engine.stream(call_id, after_seq=2)]
    assert seen == [1, 2, 3, 4] and later == [3, 4]


async def test_a_harness_that_stops_without_an_answer_fails_the_call(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter(script=scripted(Failed("turn_failed", "model exploded")))
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, _ = await start(sqlite_db, engine)
        call = await engine.wait(call_id, 10)
    assert call.phase == "failed" and call.error == {"code": "turn_failed", "message": "model exploded"}


async def test_gates_left_open_close_when_the_call_ends(sqlite_db: Database) -> None:
    adapter = ScriptedAdapter(script=scripted(GateOpened("t/1", "- write a.txt"), None))
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "waiting_input")
        await engine.cancel(call_id)
        await until_phase(engine, call_id, "cancelled")
    gate = block(await content_of(sqlite_db, response), "gate/t/1")
    assert gate is not None and gate["status"] == "failure" and "cancelled" in gate["reason"]
    with pytest.raises(Conflict):
        await engine.answer_gate(call_id, "t/1", "approve", "user:alice")


class _BurstRun(ScriptedRun):
    """Yields its whole script at once (a zero-latency harness): every update is queued before the first applies."""

    async def updates(self) -> AsyncIterator[Update]:
        for item in self.script:
            if item is not None:
                yield item
        await asyncio.Event().wait()


class _BurstAdapter(ScriptedAdapter):
    def _run(self, request: AdapterRequest, resumed: bool) -> ScriptedRun:
        run = _BurstRun(self, request.call_id, list(self.script(request.call_id)), resumed)
        self.runs.setdefault(request.call_id, []).append(run)
        return run


async def test_durable_updates_queued_together_are_applied_in_one_transaction(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast harness's updates that are already queued share one transaction (not one each), in order: the
    message, the checkpoint and the ledger end as if each had been applied alone — the checkpoint moved once per
    transaction, to its last update (the steps in between are seen by nobody)."""
    batches: list[int] = []
    moves: list[tuple[int, int]] = []
    advance = HarnessCalls.advance_checkpoint

    async def counted_advance(self: HarnessCalls, call_id: str, **kwargs: Any) -> Any:
        moves.append((kwargs["expected_checkpoint"], kwargs["checkpoint"]))
        return await advance(self, call_id, **kwargs)

    monkeypatch.setattr(HarnessCalls, "advance_checkpoint", counted_advance)
    shown: list[list[str]] = []
    alone: list[int] = []
    original, original_previews = Drive._apply, Drive._apply_previews

    async def counting(
        self: Drive, batch: Sequence[tuple[int, str, Update]], previews: Sequence[TextPreview] = ()
    ) -> bool:
        batches.append(len(batch))
        shown.append([preview.text for preview in previews])
        return await original(self, batch, previews)

    async def previews_alone(self: Drive, previews: list[TextPreview]) -> None:
        alone.append(len(previews))
        await original_previews(self, previews)

    monkeypatch.setattr(Drive, "_apply", counting)
    monkeypatch.setattr(Drive, "_apply_previews", previews_alone)
    adapter = _BurstAdapter(
        script=scripted(
            TextPreview("Hel"),
            ModelCalled("m", input_tokens=10, output_tokens=5, cost_usd=0.25),
            TextSet("Hello"),
            TextSet("Hello there"),
            Finished("Hello there"),
        )
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        call = await until_phase(engine, call_id, "succeeded")
    assert sum(batches) == 4 and len(batches) < 4, batches
    # The preview was queued in front of a durable update: shown in that update's transaction, not in one of its own.
    assert alone == [] and shown[0] == ["Hel"]
    assert call.checkpoint == 4
    assert len(moves) == len(batches) and moves[0][0] == 0 and moves[-1][1] == 4, (moves, batches)
    assert all(before[1] == after[0] for before, after in itertools.pairwise(moves))
    assert block(await content_of(sqlite_db, response), "answer") == {
        "id": "answer",
        "type": "text",
        "content": "Hello there",
    }
    structure = await SqlLedgerStore(sqlite_db).structure(Scope(harness_call_id=call_id))
    assert sum(1 for action in structure.actions if action.type == "model_call") == 1


async def test_a_first_text_goes_out_alone_while_another_answer_is_blank(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another answer shows nothing yet, a fast harness's first text is written on its own and the rest of its
    turn waits (at most `FIRST_OUTPUT_YIELD`) for that answer to show something: under a burst the event loop goes
    to the answers nobody has seen a word of first (see `FirstOutputs`)."""
    from loopd.server.streams._bus import FIRST_OUTPUT_YIELD

    written: list[tuple[str, float]] = []
    original, original_previews = Drive._apply, Drive._apply_previews

    async def apply(
        self: Drive, batch: Sequence[tuple[int, str, Update]], previews: Sequence[TextPreview] = ()
    ) -> bool:
        written.append(("durable", time.monotonic()))
        return await original(self, batch, previews)

    async def previews_alone(self: Drive, previews: list[TextPreview]) -> None:
        written.append(("text", time.monotonic()))
        await original_previews(self, previews)

    monkeypatch.setattr(Drive, "_apply", apply)
    monkeypatch.setattr(Drive, "_apply_previews", previews_alone)
    adapter = _BurstAdapter(script=scripted(TextPreview("Hel"), TextSet("Hello"), Finished("Hello")))
    bus = ConversationBus()
    bus.first_outputs.started("another-answer")  # started here, shows nothing during the test
    async with make_engine(sqlite_db, {"scripted": adapter}, bus=bus) as engine:
        call_id, response = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "succeeded")
    assert [what for what, _ in written][:2] == ["text", "durable"]
    assert written[1][1] - written[0][1] >= FIRST_OUTPUT_YIELD * 0.9
    assert block(await content_of(sqlite_db, response), "answer") == {
        "id": "answer",
        "type": "text",
        "content": "Hello",
    }

    # Alone (no other answer blank): the text goes with the durable update, at once.
    written.clear()
    bus.first_outputs.shown("another-answer")
    async with make_engine(sqlite_db, {"scripted": adapter}, bus=bus) as engine:
        call_id, _ = await start(sqlite_db, engine, key="respond-again")
        await until_phase(engine, call_id, "succeeded")
    assert written[0][0] == "durable"


class _WholeReplyModel:
    """A model whose reply arrives whole: its text and its end together (a zero-latency provider)."""

    name = "whole"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta(text="Hello")
        yield ReplyInfo(provider="test", model="whole", finish_reason="stop")


@dataclass
class _ModelCallingAdapter(ScriptedAdapter):
    """A scripted harness whose start also makes a model call in a task of its own, created while starting (as the
    built-in harness's session tasks are): when the call saw its text and when its end."""

    calls: list[asyncio.Task[tuple[float, float]]] = field(default_factory=list)

    async def start(self, request: AdapterRequest) -> ScriptedRun:
        self.calls.append(asyncio.create_task(self._call()))
        return await super().start(request)

    @staticmethod
    async def _call() -> tuple[float, float]:
        times: list[float] = []
        async for _ in RecordingModel(_WholeReplyModel()).stream(ModelRequest(model="whole", messages=(), tools=())):
            times.append(time.monotonic())
        return times[0], times[1]


async def test_a_harness_whose_reply_came_whole_waits_while_another_answer_is_blank(sqlite_db: Database) -> None:
    """A model call of a drive's run whose text and end arrived together hands on its text, then — while another
    answer of this process shows nothing yet — waits (at most `FIRST_OUTPUT_YIELD`) before its end, so the rest of
    the turn does not take the CPU those answers need; with nothing blank it goes on at once."""
    from loopd.server.streams._bus import FIRST_OUTPUT_YIELD

    adapter = _ModelCallingAdapter(script=scripted(TextPreview("Hello"), TextSet("Hello"), Finished("Hello")))
    bus = ConversationBus()
    bus.first_outputs.started("another-answer")  # started here, shows nothing during the first call
    async with make_engine(sqlite_db, {"scripted": adapter}, bus=bus) as engine:
        call_id, _ = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "succeeded")
        text, end = await adapter.calls[0]
        assert end - text >= FIRST_OUTPUT_YIELD * 0.9

        bus.first_outputs.shown("another-answer")
        call_id, _ = await start(sqlite_db, engine, key="respond-again")
        await until_phase(engine, call_id, "succeeded")
        text, end = await adapter.calls[1]
        assert end - text < FIRST_OUTPUT_YIELD / 2


def _record_preview_writes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The texts of every write of live text alone (`Drive._apply_previews`), in order, as the test's drives make
    them."""
    written: list[list[str]] = []
    original = Drive._apply_previews

    async def recording(self: Drive, previews: list[TextPreview]) -> None:
        written.append([preview.text for preview in previews])
        await original(self, previews)

    monkeypatch.setattr(Drive, "_apply_previews", recording)
    return written


async def test_live_text_waits_a_moment_for_what_the_harness_says_next(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live text is written once nothing more is queued for `PREVIEW_GATHER` seconds: text and the durable update a
    harness sends right behind it (each handed over a loop turn apart here) share one write; text followed by
    silence is still shown on its own, that moment later."""
    alone = _record_preview_writes(monkeypatch)
    adapter = ScriptedAdapter(
        script=scripted(TextPreview("Hel"), TextPreview("lo"), TextSet("Hello"), TextPreview(", w"), None)
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        await until(lambda: _shows(sqlite_db, response, "Hello, w"))
        assert alone == [[", w"]]  # the first two went with "Hello"'s write; the last waited, then went alone
        adapter.last_run(call_id).release()
        await engine.cancel(call_id)
        await until_phase(engine, call_id, "cancelled")


@given(st.integers(min_value=0, max_value=100_000), st.integers(min_value=0, max_value=100_000))
def test_later_live_text_waits_longer_the_more_calls_stream_within_bounds(fewer: int, more: int) -> None:
    """A call's first text always waits `PREVIEW_GATHER`; later text waits at least that, at most
    `PREVIEW_GATHER_MAX`, and never less for more calls streaming."""
    fewer, more = sorted((fewer, more))
    assert gather_wait(True, more) == PREVIEW_GATHER
    assert PREVIEW_GATHER <= gather_wait(False, fewer) <= gather_wait(False, more) <= PREVIEW_GATHER_MAX


def test_how_long_later_live_text_waits() -> None:
    assert gather_wait(False, 1) == PREVIEW_GATHER  # one answer: pieces shown as they come, 16 ms apart at most
    assert gather_wait(False, 16) == PREVIEW_GATHER
    assert gather_wait(False, 50) == pytest.approx(0.05)
    assert gather_wait(False, 100) == PREVIEW_GATHER_MAX  # 100 answers: about 1,000 writes a second in all
    assert gather_wait(False, 200) == PREVIEW_GATHER_MAX  # never less than ten pieces a second


async def test_a_call_streams_while_it_wrote_live_text_within_the_last_second() -> None:
    clock = VirtualClock()
    live = LiveText(clock.monotonic)
    assert live.streaming() == 0
    live.wrote("a")
    live.wrote("b")
    await clock.advance(0.5)
    assert live.streaming() == 2
    live.wrote("a")  # "b" waits for a tool, or a person: it stops counting a second after its last text
    await clock.advance(0.6)
    assert live.streaming() == 1
    live.wrote("c")
    await clock.advance(0.5)
    assert live.streaming() == 1  # "a" last wrote 1.1 s ago
    await clock.advance(0.5)
    assert live.streaming() == 0


@pytest.mark.parametrize("many", [False, True])
async def test_later_live_text_is_written_less_often_while_many_calls_stream(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch, many: bool
) -> None:
    """Text trickling in (a piece every 100 ms, after the first) is written piece by piece while few calls stream;
    while many do (here: as few writes per second are wanted as make one streaming call wait 0.8 s), the pieces that
    arrive within the wait share one write. The first text never waits longer."""
    from loopd.server.engine import _driving

    if many:
        monkeypatch.setattr(_driving, "PREVIEW_WRITES_PER_SECOND", 1)
        monkeypatch.setattr(_driving, "PREVIEW_GATHER_MAX", 0.8)
    written = _record_preview_writes(monkeypatch)
    adapter = ScriptedAdapter(
        script=scripted(TextPreview("A"), None, TextPreview("B"), None, TextPreview("C"), None, TextPreview("D"), None)
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, response = await start(sqlite_db, engine)
        await until(lambda: _shows(sqlite_db, response, "A"))
        run = adapter.last_run(call_id)
        for _ in "BCD":
            run.release()
            await asyncio.sleep(0.1)
        await until(lambda: _shows(sqlite_db, response, "ABCD"))
        assert written == ([["A"], ["B", "C", "D"]] if many else [["A"], ["B"], ["C"], ["D"]])
        run.release()
        await engine.cancel(call_id)
        await until_phase(engine, call_id, "cancelled")


async def _shows(db: Database, response: str, text: str) -> bool:
    answer = block(await content_of(db, response), "answer")
    return answer is not None and answer.get("content") == text


async def test_an_engine_ensures_its_ledger_actors_once_not_in_every_transaction(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopd.server.ledger import _sql

    ensured: list[str | None] = []
    original = _sql._LedgerSql.ensure_actor

    async def counting(self: _sql._LedgerSql, actor: Actor) -> Actor:
        ensured.append(actor.key)
        return await original(self, actor)

    monkeypatch.setattr(_sql._LedgerSql, "ensure_actor", counting)
    adapter = ScriptedAdapter(
        script=scripted(
            ToolStarted("c1", "echo", {"text": "a"}),
            None,
            ToolFinished("c1", "echo", "completed", "a"),
            None,
            ModelCalled("m", input_tokens=10, output_tokens=5, cost_usd=0.25),
            None,
            TextSet("done"),
            Finished("done"),
        )
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        for effect_key in ("respond", "again"):  # two calls: the second drive knows the actors the first ensured
            call_id, _ = await start(sqlite_db, engine, key=effect_key)
            for applied in (1, 2, 3):  # one transaction per update: each waits for the last to be applied

                async def reached(at: int = applied, call_id: str = call_id) -> bool:
                    return (await engine.get(call_id)).checkpoint >= at

                await until(reached)
                adapter.last_run(call_id).release()
            call = await until_phase(engine, call_id, "succeeded")
            assert call.checkpoint == 5
    assert sorted(key or "" for key in ensured) == ["harness:scripted", "loopd:harness-engine"]
    store = SqlLedgerStore(sqlite_db)
    actors = [await store.get_actor_by_key(key) for key in ("loopd:harness-engine", "harness:scripted")]
    (lane,) = await store.find_lanes(Scope(harness_call_id=call_id))  # the second call's trail: the same actors
    assert {event.actor_id for event in await store.load_lane(lane.id)} == {a.id for a in actors if a is not None}


async def test_a_fresh_drive_opens_its_trail_in_one_append_and_does_not_open_it_or_look_for_earlier_attempts_again(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lane, turn and action are created once, in the drive's begin; the end's transaction only closes them. A call
    ended before any drive began still gets its trail (opened at the end)."""
    from loopd.server.ledger import _sql

    lanes: list[str] = []
    looked_for_earlier: list[Scope] = []
    original = _sql._LedgerSql.create_lane
    original_unresolved = _sql._LedgerSql.unresolved_attempts

    async def counting(self: _sql._LedgerSql, lane: Lane) -> Lane:
        lanes.append(lane.run_id)
        return await original(self, lane)

    async def unresolved(self: _sql._LedgerSql, scope: Scope) -> list[UnresolvedAttempt]:
        looked_for_earlier.append(scope)
        return await original_unresolved(self, scope)

    monkeypatch.setattr(_sql._LedgerSql, "create_lane", counting)
    monkeypatch.setattr(_sql._LedgerSql, "unresolved_attempts", unresolved)
    adapter = ScriptedAdapter(script=scripted(TextSet("done"), Finished("done")))
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, _ = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "succeeded")
        assert lanes == [call_id]
        # It took the call from pending: no earlier drive can have left an attempt, so none is looked for.
        assert looked_for_earlier == []
    store = SqlLedgerStore(sqlite_db)
    (lane,) = await store.find_lanes(Scope(harness_call_id=call_id))
    types = [event.event_type for event in await store.load_lane(lane.id)]
    assert types[:4] == ["run.started", "turn.started", "action.started", "attempt.requested"]
    assert types[-1] == "run.completed"
    async with sqlite_db.transaction(read_only=True) as tx:  # the opening and the attempt's request: one append
        first = await tx.fetch(
            "SELECT first_seq, last_seq FROM ledger_appends WHERE lane_id = ? ORDER BY first_seq", (lane.id,)
        )
    assert tuple(first[0]) == (1, 4)


async def test_the_facts_of_one_transaction_go_as_one_append(sqlite_db: Database) -> None:
    """A model call and the end the harness reports together are applied in one transaction: their ledger facts go
    as one append (one batch checked and written), the same events in the same order as one append each."""
    adapter = ScriptedAdapter(
        script=scripted(
            ModelCalled("m", input_tokens=10, output_tokens=5, cost_usd=0.25), TextSet("done"), Finished("done")
        ),
        bursts=True,  # all three queued at once, as a fast harness sends them: one batch, one transaction
    )
    async with make_engine(sqlite_db, {"scripted": adapter}) as engine:
        call_id, _ = await start(sqlite_db, engine)
        await until_phase(engine, call_id, "succeeded")
    store = SqlLedgerStore(sqlite_db)
    (lane,) = await store.find_lanes(Scope(harness_call_id=call_id))
    events = await store.load_lane(lane.id)
    assert [event.event_type for event in events[4:]] == [
        "attempt.requested",  # the model call's attempt
        "attempt.completed",
        "attempt.completed",  # the execution's attempt, then its action, turn and run
        "action.completed",
        "turn.completed",
        "run.completed",
    ]
    async with sqlite_db.transaction(read_only=True) as tx:
        appends = await tx.fetch(
            "SELECT first_seq, last_seq FROM ledger_appends WHERE lane_id = ? ORDER BY first_seq", (lane.id,)
        )
    assert [tuple(row) for row in appends] == [(1, 4), (5, 10)]
    assert {event.seq for event in events} == set(range(1, 11))


async def test_gathering_live_text_never_swallows_a_cancellation() -> None:
    """The drive is cancelled (its watcher stopped it) just as the harness hands over its next update: the gather
    ends cancelled, taking nothing — it must not return the update and carry on waiting for a run that was stopped."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.ensure_future(Drive._gather_previews(queue, [TextPreview("Hel")]))
    await asyncio.sleep(0)  # it waits for what follows
    queue.put_nowait(TextSet("Hello"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queue.qsize() == 1  # still there for whoever reads on
