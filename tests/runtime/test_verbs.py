"""Every verb of ``loopd.runtime`` against a real loop-server on loopback (the whole `loopd up`, demo model)."""

from __future__ import annotations

import asyncio

import pytest

from loopd._infra.errors import ConflictError, NotFoundError
from loopd.agentue import fold
from loopd.runtime import (
    CallState,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Runtime,
    TaskNotReady,
    open_runtime,
)
from loopd.server._composition import RunningServer

from .conftest import User


async def _question(rt: Runtime, text: str = "hello") -> str:
    await rt.register("echo")
    conversation = await rt.chat.create_conversation("test")
    sent = await rt.chat.send(conversation.id, text, target=("operator", "echo"))
    return sent.task_id


async def test_register_lists_the_operator_and_names_the_runtime(rt: Runtime, user: User) -> None:
    registration = await rt.register("echo", display_name="Echo", description="says it back", lease_seconds=12)
    assert (registration.kind, registration.key, registration.lease_seconds) == ("operator", "echo", 12)
    assert registration.display_name == "Echo" and registration.expires_at is not None
    assert rt.actor == "operator:echo"
    actors = (await user.http.get("/v1/actors")).json()["data"]
    listed = [(a["kind"], a["key"], a["display_name"], a["description"]) for a in actors]
    assert ("operator", "echo", "Echo", "says it back") in listed
    with pytest.raises(ValueError, match="acts as operator:echo"):
        await rt.register("other")


async def test_chat_user_verbs_send_and_read_a_conversation(rt: Runtime) -> None:
    await rt.register("echo")
    conversation = await rt.chat.create_conversation("greetings")
    sent = await rt.chat.send(conversation.id, "hello there", target=("operator", "echo"))
    assert sent.conversation_id == conversation.id and sent.input.text == "hello there"
    assert (sent.response.kind, sent.response.key, sent.response.status) == ("operator", "echo", "streaming")
    read = await rt.chat.conversation(conversation.id)
    assert (read.id, read.name, read.actor_kind) == (conversation.id, "greetings", "user")
    history = await rt.chat.history(conversation.id)
    assert [m.id for m in history] == [sent.input.id, sent.response.id]
    assert [m.id for m in await rt.chat.history(conversation.id, after=sent.input.id)] == [sent.response.id]


async def test_task_get_gives_the_question_and_task_not_ready_before_it_exists(rt: Runtime) -> None:
    task_id = await _question(rt, "what is loopd?")
    context = await rt.task.get(task_id)
    assert context.task_id == task_id and context.input.text == "what is loopd?"
    assert context.response.purpose == "response" and context.response.status == "streaming"
    assert context.conversation.id == context.input.conversation_id and context.history[-1].id == context.input.id
    assert context.has_earlier is False
    with pytest.raises(TaskNotReady) as caught:
        await rt.task.get("no-such-task")
    assert isinstance(caught.value, NotFound) and isinstance(caught.value, NotFoundError)
    assert caught.value.status == 404 and caught.value.type == "not_found"


async def test_task_get_with_messages_gives_the_tasks_first_messages_in_the_same_read(rt: Runtime) -> None:
    task_id = await _question(rt, "first")
    assert (await rt.task.get(task_id)).messages is None  # not asked for: not read
    context = await rt.task.get(task_id, messages=100)
    assert context.messages is not None and context.more_messages is False
    assert [m.id for m in context.messages] == [m.id for m in await rt.task.messages(task_id)]
    one = await rt.task.get(task_id, messages=1)
    assert one.messages is not None and [m.purpose for m in one.messages] == ["input"] and one.more_messages
    with pytest.raises(InvalidRequest):
        await rt.task.get(task_id, messages=101)


async def test_task_messages_and_followups_page_in_id_order(rt: Runtime) -> None:
    task_id = await _question(rt, "first")
    context = await rt.task.get(task_id)
    assert [m.purpose for m in await rt.task.messages(task_id)] == ["input", "response"]
    assert [m.purpose for m in await rt.task.messages(task_id, limit=1)] == ["input"]
    assert await rt.task.followups(task_id) == []
    later = await rt.chat.send(context.conversation.id, "and also this", target=("operator", "echo"))
    followups = await rt.task.followups(task_id)
    assert [(m.id, m.text) for m in followups] == [(later.input.id, "and also this")]
    assert await rt.task.followups(task_id, after=later.input.id) == []


async def test_emit_answer_and_complete_write_the_response(rt: Runtime, user: User) -> None:
    task_id = await _question(rt)
    context = await rt.task.get(task_id)
    emitted = await rt.chat.emit(task_id, [{"op": "set", "block": {"id": "note", "type": "text", "content": "a "}}])
    assert emitted.message_id == context.response.id and emitted.seq >= 1
    await rt.chat.answer(task_id, "the answer")
    await rt.chat.answer(task_id, "the answer")  # a whole-block set: repeating it changes nothing visible
    response = await rt.chat.complete(task_id)
    assert response.status == "completed" and response.text == "a \n\nthe answer"
    assert (await rt.chat.complete(task_id)).status == "completed"  # idempotent
    with pytest.raises(Conflict) as caught:
        await rt.chat.emit(task_id, [{"op": "set", "block": {"id": "late", "type": "text", "content": "x"}}])
    assert isinstance(caught.value, ConflictError) and caught.value.status == 409
    stored = await user.message(context.conversation.id, context.response.id)
    assert stored["status"] == "completed"


async def test_complete_with_an_answer_sets_it_and_ends_in_one_request(rt: Runtime, user: User) -> None:
    task_id = await _question(rt)
    context = await rt.task.get(task_id)
    response = await rt.chat.complete(task_id, answer="all at once")
    assert response.status == "completed" and response.text == "all at once"
    assert (await rt.chat.complete(task_id, answer="all at once")).text == "all at once"  # idempotent
    stored = await user.message(context.conversation.id, context.response.id)
    assert stored["status"] == "completed"
    assert stored["content"]["blocks"] == [{"id": "answer", "type": "text", "content": "all at once"}]


async def test_complete_with_an_error_fails_the_response(rt: Runtime) -> None:
    task_id = await _question(rt)
    failed = await rt.chat.complete(task_id, ("echo_failed", "nothing to echo"))
    assert failed.status == "failed"
    assert failed.content["meta"]["error"]["code"] == "echo_failed"
    with pytest.raises(InvalidRequest):
        await rt.chat.emit(task_id, [])  # at least one event


async def test_harness_prompt_reattaches_streams_and_reports_its_value(rt: Runtime) -> None:
    task_id = await _question(rt)
    context = await rt.task.get(task_id)
    call = await rt.harness.prompt(
        "owner-1",
        "work/0",
        "assistant",
        "say hi",
        task_id=task_id,
        output=None,
        conversation_id=context.conversation.id,
    )
    again = await rt.harness.prompt(
        "owner-1",
        "work/0",
        "assistant",
        "say hi",
        task_id=task_id,
        output=None,
        conversation_id=context.conversation.id,
    )
    assert again.id == call.id and again.message_id == call.message_id is not None
    events = [event async for event in call.stream()]
    assert events[0]["op"] == "start" and events[-1]["op"] == "end"
    assert [e["seq"] for e in events[:-1]] == list(range(1, len(events)))
    state: CallState = await call.value()
    assert state.terminal and state.succeeded and "say hi" in state.text
    tail = [event async for event in call.stream(after=2)]  # resumed after seq 2: its snapshot start is skipped
    assert tail[0]["seq"] == 3 and tail[-1]["op"] == "end"
    resumed, whole = fold([*events[:2], *tail]).model, fold(events).model
    assert resumed is not None and whole is not None and resumed.to_json() == whole.to_json()
    with pytest.raises(Conflict):
        await rt.harness.prompt(
            "owner-1", "work/0", "assistant", "other", task_id=task_id, output=None,
            conversation_id=context.conversation.id,
        )  # fmt: skip
    assert (await call.cancel()).phase == "succeeded"  # cancelling an ended call changes nothing
    assert (await rt.harness.get(call.id)).state.id == call.id


async def test_harness_prompt_with_wait_returns_the_ended_call_in_one_request(rt: Runtime) -> None:
    task_id = await _question(rt)
    call = await rt.harness.prompt("owner-w", "plan/0", "assistant", "say hi", task_id=task_id, wait=20)
    assert call.state.terminal and call.state.succeeded and "say hi" in call.state.text
    assert (await call.wait(timeout=1)).id == call.id  # ended already: no waiting
    replay = await rt.harness.prompt("owner-w", "plan/0", "assistant", "say hi", task_id=task_id)
    assert replay.id == call.id and replay.state.terminal  # wait is not one of the call's parameters
    for wait in (-1.0, 31.0):
        with pytest.raises(InvalidRequest):
            await rt.harness.prompt("owner-w", "plan/1", "assistant", "x", task_id=task_id, wait=wait)


async def test_harness_find_returns_the_started_call_whatever_its_parameters(rt: Runtime) -> None:
    task_id = await _question(rt)
    call = await rt.harness.prompt("owner-f", "plan/0", "assistant", "first prompt", task_id=task_id)
    with pytest.raises(Conflict):
        await rt.harness.prompt("owner-f", "plan/0", "assistant", "a reworded prompt", task_id=task_id)
    found = await rt.harness.find("owner-f", "plan/0")
    assert found is not None and found.id == call.id and found.message_id == call.message_id
    assert await rt.harness.find("owner-f", "plan/9") is None
    assert await rt.harness.find("nobody", "plan/0") is None


async def test_a_cancelled_call_ends_cancelled(rt: Runtime) -> None:
    task_id = await _question(rt)
    context = await rt.task.get(task_id)
    # "list files" makes the demo model call a tool, which waits at the permission gate until the call is cancelled.
    call = await rt.harness.prompt(
        "owner-2", "work/1", "assistant", "list files", task_id=task_id, output=None,
        conversation_id=context.conversation.id,
    )  # fmt: skip
    assert (await call.cancel()).cancel_requested

    async def cancelled() -> CallState:
        async for event in call.stream():
            if event["op"] == "end":
                break
        return await call.value()

    state = await asyncio.wait_for(cancelled(), 30)
    assert state.phase == "cancelled" and state.terminal and state.text == ""


async def test_human_ask_and_confirm_get_the_users_answers(rt: Runtime, user: User) -> None:
    task_id = await _question(rt)
    context = await rt.task.get(task_id)
    question = await rt.human.ask(
        task_id, "db", title="Database", prompt="Which one?", choices=["pg", ("lite", "SQLite")], timeout=600
    )
    assert question.state.status == "pending" and question.state.created and question.state.type == "ask"
    assert (await rt.human.ask(
        task_id, "db", title="Database", prompt="Which one?", choices=["pg", ("lite", "SQLite")], timeout=600
    )).message_id == question.message_id  # fmt: skip
    with pytest.raises(Conflict):
        await rt.human.ask(task_id, "db", title="Database", prompt="Another?", allow_other=True, timeout=600)
    reply = {"reply_to_message_id": question.message_id, "outcome": "success", "value": "lite"}
    answered = await user.http.post(f"/v1/conversations/{context.conversation.id}/tasks/{task_id}/replies", json=reply)
    assert answered.status_code == 200, answered.text
    state = await question.get()
    assert (state.status, state.value, state.terminal) == ("success", "lite", True)
    confirm = await rt.human.confirm(task_id, "go", title="Go on?", prompt="Deploy now?", timeout=600)
    assert confirm.state.type == "confirm" and not confirm.state.terminal
    reply = {"reply_to_message_id": confirm.message_id, "outcome": "success", "value": "accepted"}
    await user.http.post(f"/v1/conversations/{context.conversation.id}/tasks/{task_id}/replies", json=reply)
    assert (await (await rt.human.get(confirm.message_id)).get()).accepted


async def test_a_responder_token_is_kept_to_its_own_tasks(rt: Runtime, server: RunningServer, user: User) -> None:
    task_id = await _question(rt)
    made = await user.http.post("/v1/tokens", json={"actor": "operator:other"})
    assert made.status_code == 201, made.text
    async with open_runtime(server.url, token=made.json()["token"]) as other:
        with pytest.raises(Forbidden) as caught:
            await other.chat.emit(task_id, [{"op": "set", "block": {"id": "x", "type": "text", "content": "x"}}])
        assert caught.value.status == 403 and caught.value.type == "forbidden"
        with pytest.raises(Forbidden):
            await other.chat.send("any", "hi", target=("operator", "echo"))  # conversations belong to users
