"""The answer text a call streams into its message stays consistent for a client that applies the events in order.

For the ``answer`` block: the first event is a ``set``, every later one an ``append`` (live text, then only the
missing suffix of the durable text), so the final text is the first set followed by every append — through a
gate, and across a crash that re-issues the model call in flight. Only a re-issued call that says something else
than what was already shown rewrites the block, with exactly one ``set``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from loopd._infra.clock import VirtualClock
from loopd.cli._chat import _View
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, HarnessEngine
from loopd.server.storage import Database, DatabaseOptions, open_database

from .conftest import (
    answer_events,
    applied_in_order,
    assert_append_only,
    content_of,
    make_engine,
    new_conversation,
    new_response,
    until,
    until_done,
    until_phase,
)
from .rigs import FINAL_TEXT, FIRST_TEXT, Script, open_rig

ANSWER = f"{FIRST_TEXT}\n\n{FINAL_TEXT}"


async def _start(db: Database, engine: HarnessEngine) -> tuple[str, str]:
    conversation = await new_conversation(db)
    response = await new_response(db, conversation, task_id="task-8")
    call = await engine.start(
        CallRequest(
            owner_uid="task-uid-8",
            effect_key="respond",
            target="builtin",
            text="please write a.txt",
            message_id=response,
            asker="user:alice",
            timeout=120,
        )
    )
    return call.id, response


async def _answer_gate(engine: HarnessEngine, db: Database, call_id: str, response: str) -> None:
    await until_phase(engine, call_id, "waiting_input")
    content = await content_of(db, response)
    gate = next(b["id"] for b in content["blocks"] if b["type"] == "ask")
    await engine.answer_gate(call_id, gate.removeprefix("gate/"), "approve", "user:alice")


@pytest.mark.parametrize("chunk_delay", [0.0, 0.001, 0.003])
async def test_a_gated_chat_stores_one_set_then_appends_of_the_answer(tmp_path: Path, chunk_delay: float) -> None:
    script = Script(chunk_delay=chunk_delay)
    async with (
        open_rig(tmp_path / "harness", script=script) as harness,
        open_database(tmp_path / "loopd.db") as db,
    ):
        async with make_engine(db, {"builtin": BuiltinHarnessAdapter(harness.rig)}) as engine:
            call_id, response = await _start(db, engine)
            await _answer_gate(engine, db, call_id, response)
            call = await engine.wait(call_id, 20)
        assert call.phase == "succeeded", call.error
        assert_append_only(await answer_events(db, response), ANSWER)
        assert (await content_of(db, response))["blocks"][0]["content"] == ANSWER


def rendered_by_chat(events: list[dict[str, Any]]) -> tuple[str, str]:
    """What `loopd chat` prints for these events: (stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    view = _View(console=Console(file=err, highlight=False, width=200), out=out)
    for event in events:
        view.apply(event)
        view.render_progress()
    return out.getvalue(), err.getvalue()


async def _crash_mid_answer(
    tmp_path: Path, clock: VirtualClock, script: Script
) -> tuple[list[tuple[str, str]], str, list[dict[str, Any]]]:
    """Stream the answer's first chunk, crash the engine (and its in-process session), resume on a second one."""
    async with (
        open_rig(tmp_path / "harness", script=script) as harness,
        open_database(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock)) as db,
    ):
        adapter = BuiltinHarnessAdapter(harness.rig)
        first = make_engine(db, {"builtin": adapter}, clock=clock, replica_id="first")
        await first.open()
        call_id, response = await _start(db, first)
        await _answer_gate(first, db, call_id, response)

        async def first_chunk_shown() -> bool:
            return applied_in_order(await answer_events(db, response)).endswith("\n\nWrot")

        await until(first_chunk_shown)  # the re-issued call must not show it twice
        await first.abort()

        await clock.advance(31)  # the crashed engine's lease expires
        async with make_engine(db, {"builtin": adapter}, clock=clock, replica_id="second") as second:
            call = await until_done(second, call_id, timeout=20)
        assert call.phase == "succeeded", call.error
        assert script.final_calls == 2  # the model call in flight was re-issued
        content = await content_of(db, response)
        async with db.transaction(read_only=True) as tx:
            stored = [e.event for e in await tx.message_events.read(response, limit=1000)]
        return await answer_events(db, response), content["blocks"][0]["content"], stored


async def test_a_crash_mid_answer_resumes_without_repeating_streamed_text(tmp_path: Path, clock: VirtualClock) -> None:
    events, final, stored = await _crash_mid_answer(tmp_path, clock, Script(stall_final_mid=True))
    assert final == ANSWER
    assert_append_only(events, ANSWER)
    assert rendered_by_chat(stored)[0] == ANSWER  # `loopd chat` prints the answer once


async def test_a_re_issued_call_that_says_something_else_rewrites_the_answer_once(
    tmp_path: Path, clock: VirtualClock
) -> None:
    other = "Done: a.txt exists."
    script = Script(stall_final_mid=True, final_texts={2: other})
    events, final, stored = await _crash_mid_answer(tmp_path, clock, script)
    assert final == f"{FIRST_TEXT}\n\n{other}"
    sets = [index for index, (op, _) in enumerate(events) if op == "set"]
    assert len(sets) == 2 and sets[0] == 0, events  # the first set and one rewrite
    assert applied_in_order(events) == final
    rewrite = events[sets[1]][1]
    assert f"{FIRST_TEXT}\n\n".startswith(rewrite) or rewrite.startswith(f"{FIRST_TEXT}\n\n"), rewrite
    printed, notes = rendered_by_chat(stored)  # `loopd chat` applies the rewrite: prints the answer again
    assert printed.endswith("\n" + final) and "revised" in notes
