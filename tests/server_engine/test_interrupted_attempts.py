"""An attempt whose drive died is "unresolved" only while nobody knows better: the next drive of the call settles it
as ``attempt.failed`` with ``reason: "interrupted"``, its unreported usage estimated (from the live text the
lost model call showed) or unknown, both marked ``usage_estimated: true`` — and a call that ends first closes it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from loopd._infra.clock import VirtualClock
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, Finished, HarnessEngine, TextPreview, TextSet
from loopd.server.ledger import Event, Scope, SqlLedgerStore
from loopd.server.storage import Database, DatabaseOptions, open_database

from .conftest import (
    ScriptedAdapter,
    answer_events,
    applied_in_order,
    make_engine,
    new_conversation,
    new_response,
    scripted,
    until,
    until_done,
    until_phase,
    until_true,
)
from .rigs import Script, open_rig
from .test_stream_text import _answer_gate, _start


async def _call(db: Database, engine: HarnessEngine, text: str = "question") -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation)
    call = await engine.start(CallRequest("task-uid", "respond", "scripted", text, message_id=response, timeout=600))
    return call.id, response


def _outcomes(events: list[Event], requested: Event) -> list[Event]:
    return [e for e in events if e.subject_id == requested.subject_id and e.event_type != "attempt.requested"]


def _executions(events: list[Event]) -> list[Event]:
    return [e for e in events if e.event_type == "attempt.requested" and "mode" in e.payload]


async def test_a_crash_mid_answer_is_settled_with_an_estimate_of_the_lost_model_call(
    tmp_path: Path, clock: VirtualClock
) -> None:
    async with (
        open_rig(tmp_path / "harness", script=Script(stall_final_mid=True)) as harness,
        open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)) as db,
    ):
        adapter = BuiltinHarnessAdapter(harness.rig)
        first = make_engine(db, {"builtin": adapter}, clock=clock, replica_id="first")
        await first.open()
        call_id, response = await _start(db, first)
        await _answer_gate(first, db, call_id, response)

        async def streaming() -> bool:
            return applied_in_order(await answer_events(db, response)).endswith("\n\nWrot")

        await until(streaming)
        await first.abort()
        store = SqlLedgerStore(db)
        unresolved = await store.unresolved_attempts(Scope(harness_call_id=call_id))
        assert len(unresolved) == 1  # in doubt while nobody resumed the call

        await clock.advance(31)
        async with make_engine(db, {"builtin": adapter}, clock=clock, replica_id="second") as second:
            call = await until_done(second, call_id, timeout=20)
            view = await second.trail(call_id)
        assert call.phase == "succeeded", call.error
        assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []
        first_attempt, second_attempt = _executions(view.events)
        (settled,) = _outcomes(view.events, first_attempt)
        assert settled.event_type == "attempt.failed" and settled.payload["reason"] == "interrupted"
        assert settled.payload["usage_estimated"] is True
        assert [e.event_type for e in _outcomes(view.events, second_attempt)] == ["attempt.completed"]

        # The estimate: "\n\nWrot" was shown past the durable "Let me write it." (output ≈ 6 chars / 4), the
        # context ≈ the first model call's input + output, at that call's average price.
        reported = [
            e.payload["usage"] for e in view.events if e.event_type == "attempt.completed" and "usage" in e.payload
        ]
        previous = reported[0]
        context = previous["input_tokens"] + previous["output_tokens"]
        estimate: dict[str, Any] = settled.payload["usage"]
        assert (estimate["input_tokens"], estimate["output_tokens"]) == (context, math.ceil(len("\n\nWrot") / 4))
        totals = await store.usage(Scope(harness_call_id=call_id))
        assert totals.input_tokens == sum(u["input_tokens"] for u in reported) + context  # the estimate counts
        assert totals.usage_estimated and totals.estimated_attempts == 1


async def test_a_re_run_adapter_estimates_the_lost_completion_from_its_prompt(
    sqlite_db: Database, clock: VirtualClock
) -> None:
    adapter = ScriptedAdapter(
        script=scripted(
            TextPreview("Hel", offset=0), TextPreview("lo", offset=3), None, TextSet("Hello"), Finished("Hello")
        ),
        replays=False,
    )
    crashed = make_engine(sqlite_db, {"scripted": adapter}, replica_id="a", clock=clock)
    await crashed.open()
    call_id, response = await _call(sqlite_db, crashed, text="a question of 27 characters")

    async def shown() -> bool:
        return applied_in_order(await answer_events(sqlite_db, response)) == "Hello"

    await until(shown)  # the lost run's live text, shown before the crash
    await crashed.abort()

    await clock.advance(31)
    async with make_engine(sqlite_db, {"scripted": adapter}, replica_id="b", clock=clock) as survivor:
        await until_true(lambda: len(adapter.runs[call_id]) == 2)
        adapter.last_run(call_id).release()
        call = await until_done(survivor, call_id, timeout=30)  # real-time guard, generous on a loaded machine
        view = await survivor.trail(call_id)
    assert call.phase == "succeeded"
    first_attempt, _ = _executions(view.events)
    (settled,) = _outcomes(view.events, first_attempt)
    assert settled.payload["reason"] == "interrupted"
    assert settled.payload["usage"] == {"input_tokens": math.ceil(27 / 4), "output_tokens": 2, "cost_usd": 0.0}


async def test_a_call_that_ends_before_any_resume_closes_the_cut_short_attempt(
    sqlite_db: Database, clock: VirtualClock
) -> None:
    adapter = ScriptedAdapter(script=scripted(TextSet("a"), None, Finished("a")))
    crashed = make_engine(sqlite_db, {"scripted": adapter}, replica_id="a", clock=clock)
    await crashed.open()
    call_id, _ = await _call(sqlite_db, crashed)
    await until_phase(crashed, call_id, "running")
    await until_true(lambda: adapter.active.get(call_id, 0) == 1)
    await crashed.abort()

    await clock.advance(31)
    async with make_engine(sqlite_db, {"scripted": adapter}, replica_id="b", clock=clock) as survivor:
        await survivor.cancel(call_id)  # asked before the survivor resumed it: it only closes the call
        call = await until_phase(survivor, call_id, "cancelled")
        view = await survivor.trail(call_id)
    assert call.phase == "cancelled"
    store = SqlLedgerStore(sqlite_db)
    assert await store.unresolved_attempts(Scope(harness_call_id=call_id)) == []
    (only,) = _executions(view.events)
    (settled,) = _outcomes(view.events, only)
    assert settled.event_type == "attempt.failed" and settled.payload["reason"] == "interrupted"
    assert settled.payload["usage"] is None and settled.payload["usage_estimated"] is True
    assert (await store.usage(Scope(harness_call_id=call_id))).estimated_attempts == 1
