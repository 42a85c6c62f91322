"""The verbs over loop-server's operator surface (issue 12 §1): listing a responder's Tasks, Speak / Tell outputs,
harness calls projected into the work conversation, and the bounded waits of calls and questions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loopd.runtime import CapacityFull, Conflict, Forbidden, InvalidRequest, Runtime, open_runtime
from loopd.server._composition import RunningServer, UpSettings, open_loop_server

from .conftest import User


async def _question(rt: Runtime, user: User, text: str = "hello") -> str:
    await rt.register("echo")
    return str((await user.ask(text))["task_id"])


async def test_task_list_names_the_open_tasks_of_a_responder(rt: Runtime, user: User, server: RunningServer) -> None:
    first = await _question(rt, user, "one")
    second = await _question(rt, user, "two")
    listed = await rt.task.list("echo", page_size=1)  # every page
    assert [t.task_id for t in listed] == sorted([first, second])
    summary = listed[0]
    assert (summary.target_kind, summary.target_key) == ("operator", "echo") and summary.delivery_state == ""
    await rt.chat.complete(first)
    assert [t.task_id for t in await rt.task.list("echo")] == [second]
    made = await user.http.post("/v1/tokens", json={"actor": "operator:other"})
    async with open_runtime(server.url, token=made.json()["token"]) as other:
        with pytest.raises(Forbidden):
            await other.task.list("echo")


async def test_speak_publishes_one_message_idempotently_by_key(rt: Runtime, user: User) -> None:
    task_id = await _question(rt, user)
    context = await rt.task.get(task_id)
    note = await rt.chat.speak(task_id, "ack", text="Working on it", conversation="main")
    assert (note.kind, note.key, note.purpose, note.status) == ("operator", "echo", "output", "completed")
    assert note.conversation_id == context.conversation.id and note.reply_to_message_id == context.input.id
    assert note.text == "Working on it" and note.task_id == task_id
    assert (await rt.chat.speak(task_id, "ack", text="Working on it", conversation="main")).id == note.id
    with pytest.raises(Conflict):
        await rt.chat.speak(task_id, "ack", text="Something else", conversation="main")
    work = await rt.chat.speak(task_id, "detail", content=_model("in the work conversation"), conversation="work")
    assert work.conversation_id != context.conversation.id and work.text == "in the work conversation"
    with pytest.raises(ValueError, match="exactly one"):
        await rt.chat.speak(task_id, "both", text="a", content=_model("b"))
    assert {m.id for m in await rt.task.messages(task_id)} >= {note.id, work.id}


async def test_tell_opens_a_streaming_output_that_ends_exactly_once(rt: Runtime, user: User) -> None:
    task_id = await _question(rt, user)
    output = await rt.chat.tell(task_id, "notes", title="Notes")
    assert output.created and output.message.status == "streaming" and output.message.kind == "operator"
    await output.append_text("Hello, ")
    await output.emit([{"op": "append", "mask": "block.content", "block": {"id": "text", "content": "world"}}])
    again = await rt.chat.tell(task_id, "notes", title="Notes")
    assert again.id == output.id and not again.created
    ended = await output.end()
    assert ended.status == "completed" and ended.text == "Hello, world"
    assert (await output.end()).status == "completed"  # the same end again: no change
    with pytest.raises(Conflict):
        await output.end(("late", "a different end"))
    with pytest.raises(Conflict):
        await output.append_text("too late")
    failed_output = await rt.chat.tell(task_id, "risky", conversation="main")
    with pytest.raises(RuntimeError, match="boom"):
        async with failed_output:
            await failed_output.append_text("partial")
            raise RuntimeError("boom")
    assert failed_output.message.status == "failed"
    async with await rt.chat.tell(task_id, "fine") as fine:
        await fine.append_text("done")
    assert fine.message.status == "completed"


async def test_a_call_with_output_work_writes_one_harness_message_and_wait_returns_its_end(
    rt: Runtime, user: User
) -> None:
    task_id = await _question(rt, user)
    task = await rt.task.get(task_id)
    call = await rt.harness.prompt("uid-w", "work/0", "assistant", "say hello", task_id=task_id)
    assert call.message_id is not None and call.conversation_id != task.conversation.id
    again = await rt.harness.prompt("uid-w", "work/0", "assistant", "say hello", task_id=task_id)
    assert (again.id, again.message_id) == (call.id, call.message_id)
    state = await call.wait()
    assert state.terminal and state.succeeded and "say hello" in state.text
    outputs = [m for m in await rt.task.messages(task_id) if m.id == call.message_id]
    assert [(m.kind, m.key, m.purpose) for m in outputs] == [("harness", "assistant", "output")]
    with pytest.raises(InvalidRequest, match="task_id"):
        await rt.harness.prompt("uid-w", "work/1", "assistant", "x")  # output="work" needs the Task


async def test_wait_with_a_timeout_gives_up_without_cancelling_the_call(rt: Runtime, user: User) -> None:
    task_id = await _question(rt, user)
    # "list files" makes the demo model call a tool, which waits at the permission gate.
    call = await rt.harness.prompt("uid-g", "work/0", "assistant", "list files", task_id=task_id)
    with pytest.raises(TimeoutError):
        await call.wait(timeout=0.5)
    assert not (await call.value()).terminal  # still running: giving up on a wait never cancels
    waiter = asyncio.create_task(call.wait())
    await asyncio.sleep(0)
    waiter.cancel()  # cancelling a wait never cancels the call either
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not (await call.value()).cancel_requested
    await call.cancel()
    assert (await asyncio.wait_for(call.wait(), 30)).phase == "cancelled"


async def test_question_wait_returns_the_users_answer(rt: Runtime, user: User) -> None:
    task_id = await _question(rt, user)
    context = await rt.task.get(task_id)
    question = await rt.human.ask(task_id, "color", title="Color", prompt="Which?", allow_other=True, timeout=600)
    with pytest.raises(TimeoutError):
        await question.wait(timeout=0.3)
    waiting = asyncio.create_task(question.wait())
    reply = {"reply_to_message_id": question.message_id, "outcome": "success", "value": "teal"}
    answered = await user.http.post(f"/v1/conversations/{context.conversation.id}/tasks/{task_id}/replies", json=reply)
    assert answered.status_code == 200, answered.text
    state = await asyncio.wait_for(waiting, 30)
    assert (state.status, state.value) == ("success", "teal")


def _model(text: str) -> dict[str, object]:
    return {"version": "1.1", "biz": "test", "meta": {}, "blocks": [{"id": "text", "type": "text", "content": text}]}


async def test_a_full_engine_answers_capacity_full(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path / "data", port=0, engine_capacity=1)
    async with open_loop_server(settings) as server, open_runtime(data_dir=server.data_dir) as rt:
        asker = User(server)
        try:
            task_id = await _question(rt, asker)
            # "list files" holds the one slot: its tool waits at the permission gate.
            held = await rt.harness.prompt("uid-c", "work/0", "assistant", "list files", task_id=task_id)
            with pytest.raises(CapacityFull) as caught:
                await rt.harness.prompt("uid-c", "work/1", "assistant", "say hi", task_id=task_id)
            assert caught.value.status == 429 and caught.value.retryable
            await held.cancel()
            assert (await asyncio.wait_for(held.wait(), 30)).phase == "cancelled"
        finally:
            await asker.aclose()
