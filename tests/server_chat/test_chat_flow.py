"""The chat request flow: atomic messages + Task, the commit window, the Task API, completion, follow-ups."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.agentue import fold
from loopd.server.chat import TaskUnavailable
from loopd.server.storage import NotFound
from loopd.server.streams import finish
from tests.server_http.support import (
    CommitFailingDatabase,
    Rig,
    ask,
    error_of,
    new_conversation,
    task_object,
    text_events,
)
from tests.server_storage.helpers import record_statements


async def _count_messages(rig: Rig, conversation_id: str) -> int:
    async with rig.db.transaction(read_only=True) as tx:
        return len(await tx.messages.list_conversation(conversation_id))


def _record_transactions(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements of every transaction the rig's database runs from now on (until ``monkeypatch.undo``)."""
    transactions: list[list[str]] = []
    opened = rig.db.transaction

    @contextlib.asynccontextmanager
    async def recorded(**kwargs: Any) -> AsyncIterator[Any]:
        async with opened(**kwargs) as tx:
            transactions.append(record_statements(tx, writes=True))
            yield tx

    monkeypatch.setattr(rig.db, "transaction", recorded)
    return transactions


async def test_a_chat_request_stores_input_and_response_and_creates_the_task(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "first")
    accepted = await ask(user, cid, "What is 2+2?")
    task_id = accepted["task_id"]
    inp, resp = accepted["input"], accepted["response"]
    assert inp["purpose"] == "input" and inp["kind"] == "user" and inp["key"] == "local"
    assert inp["status"] == "completed" and inp["task_id"] == task_id
    assert inp["content"]["blocks"] == [{"id": "text", "type": "text", "role": "user", "content": "What is 2+2?"}]
    assert resp["purpose"] == "response" and (resp["kind"], resp["key"]) == ("operator", "echo")
    assert resp["status"] == "streaming" and resp["reply_to_message_id"] == inp["id"] and resp["task_id"] == task_id
    assert resp["content"]["blocks"] == []
    task = await task_object(rig, task_id)
    assert task is not None
    assert task["metadata"]["namespace"] == "default"
    assert task["spec"] == {"target": {"kind": "operator", "key": "echo"}, "revision": 1}  # and nothing else
    # Its target as labels too, so a watch selects its own Tasks on the server.
    assert task["metadata"]["labels"] == {"loopd.dev/target-kind": "operator", "loopd.dev/target-key": "echo"}
    listed = (await user.get("/v1/conversations")).json()["data"]
    assert [c["id"] for c in listed] == [cid]


async def test_content_models_are_accepted_and_checked(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    model = {"version": "1.1", "biz": "app", "meta": {}, "blocks": [{"id": "q", "type": "text", "content": "hi"}]}
    response = await user.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "harness", "key": "assistant"}, "content": model}
    )
    assert response.status_code == 201
    assert response.json()["response"]["content"]["biz"] == "app"
    bad: list[dict[str, Any]] = [
        {"target": {"kind": "operator", "key": "echo"}},  # neither content nor text
        {"target": {"kind": "operator", "key": "echo"}, "text": "a", "content": model},  # both
        {"text": "no target"},
        {"target": {"kind": "user", "key": "x"}, "text": "a"},
        {
            "target": {"kind": "operator", "key": "echo"},
            "content": {"version": "9.0", "biz": "x", "meta": {}, "blocks": []},
        },
        {"target": {"kind": "operator", "key": "echo"}, "content": {**model, "blocks": []}},
        {
            "target": {"kind": "operator", "key": "echo"},
            "content": {**model, "blocks": [{"id": "a", "type": "ask", "prompt": "?", "allow_other": True}]},
        },
        {"target": {"kind": "operator", "key": "echo"}, "content": {**model, "meta": {"human": {}}}},
    ]
    for body in bad:
        answer = await user.post(f"/v1/conversations/{cid}/messages", json=body)
        assert answer.status_code == 400, body
        assert error_of(answer) == "invalid_request"
    assert await _count_messages(rig, cid) == 2
    assert len(rig.gateway.created) == 1


async def test_a_failing_task_create_rolls_the_messages_back_and_answers_503(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    rig.gateway.fail_create = RuntimeError("the resource API is down")
    response = await user.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "operator", "key": "echo"}, "text": "hi"}
    )
    assert response.status_code == 503 and error_of(response) == "service_unavailable"
    assert await _count_messages(rig, cid) == 0
    async with rig.db.transaction(read_only=True) as tx:
        assert await tx.message_events.last_cursor(cid) == 0  # no event either
    assert rig.gateway.created == []
    rig.gateway.fail_create = None
    assert (await ask(user, cid))["task_id"]  # the same conversation works again


async def test_a_commit_failure_after_the_task_was_created_deletes_the_task(rig: Rig) -> None:
    assert isinstance(rig.db, CommitFailingDatabase)
    user = rig.client()
    cid = await new_conversation(user)
    rig.db.fail_commits = 1
    response = await user.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "operator", "key": "echo"}, "text": "hi"}
    )
    assert response.status_code == 503
    assert len(rig.gateway.created) == 1
    assert rig.gateway.deleted == rig.gateway.created  # compensated
    assert await task_object(rig, rig.gateway.created[0]) is None
    assert await _count_messages(rig, cid) == 0


async def test_in_the_commit_window_the_task_context_is_404(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    seen: dict[str, Any] = {}

    async def look(task_id: str) -> None:
        # The Task exists now and the messages do not yet: what an operator that is very fast would see.
        seen["task"] = await task_object(rig, task_id)
        with pytest.raises(NotFound):
            await rig.task_api.task_context(task_id)
        seen["http"] = await operator.get(f"/v1/tasks/{task_id}")

    rig.gateway.during_create = look
    accepted = await ask(user, cid)
    assert seen["task"] is not None
    assert seen["http"].status_code == 404 and error_of(seen["http"]) == "not_found"
    context = await operator.get(f"/v1/tasks/{accepted['task_id']}")
    assert context.status_code == 200  # after the commit, the retry succeeds


async def test_the_task_context_has_the_history_through_the_input(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    first = await ask(user, cid, "one")
    await operator.post(f"/v1/tasks/{first['task_id']}/events", json={"events": text_events("a", "uno")})
    await operator.post(f"/v1/tasks/{first['task_id']}/complete", json={})
    second = await ask(user, cid, "two")
    body = (await operator.get(f"/v1/tasks/{second['task_id']}")).json()
    assert body["task_id"] == second["task_id"]
    assert body["input"]["id"] == second["input"]["id"] and body["response"]["id"] == second["response"]["id"]
    assert body["conversation"]["id"] == cid
    history = body["history"]
    assert [m["purpose"] for m in history] == ["input", "response", "input"]
    assert history[-1]["id"] == second["input"]["id"]  # through the input, not the new response
    assert history[1]["content"]["blocks"] == [{"id": "a", "type": "text", "content": "uno"}]
    assert body["history_from_message_id"] == history[0]["id"] and body["has_earlier"] is False
    messages = (await operator.get(f"/v1/tasks/{second['task_id']}/messages")).json()["data"]
    assert [m["id"] for m in messages] == [second["input"]["id"], second["response"]["id"]]


async def test_emit_streams_into_the_response_and_completion_closes_it(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    emitted = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("answer", "Hel", "lo")})
    assert emitted.status_code == 200, emitted.text
    assert emitted.json()["seq"] == 4  # start, set, append, append
    done = await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    assert done.status_code == 200
    body = done.json()
    assert body["delivery_state"] == "closed"
    assert body["response"]["status"] == "completed"
    assert body["response"]["content"]["blocks"] == [{"id": "answer", "type": "text", "content": "Hello"}]
    assert await task_object(rig, task_id) is None
    # Snapshot == the fold of the stored log.
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read(body["response"]["id"])
    folded = fold([e.event for e in events])
    assert folded.ended and folded.model is not None
    assert folded.model.to_json() == body["response"]["content"]
    assert [e.event["op"] for e in events] == ["start", "set", "append", "append", "end"]


async def test_emit_refuses_human_blocks_start_end_and_late_events(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    bad: list[list[dict[str, Any]]] = [
        [{"op": "set", "block": {"id": "q", "type": "ask", "prompt": "?", "allow_other": True}}],
        [{"op": "set", "block": {"id": "c", "type": "confirm", "prompt": "ok?"}}],
        [{"op": "set", "block": {"id": "r", "type": "human_reply", "outcome": "dismissed"}}],
        [{"op": "set", "mask": "meta.human", "meta": {"human": {"x": 1}}}],
        [{"op": "start", "model": {"version": "1.1", "biz": "x", "meta": {}, "blocks": []}}],
        [{"op": "end"}],
        [{"op": "append", "mask": "block.content", "block": {"id": "nope", "content": 5}}],
        [{"op": "teleport"}],
    ]
    for events in bad:
        response = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": events})
        assert response.status_code == 400, events
        assert error_of(response) == "invalid_request"
    assert (await operator.post(f"/v1/tasks/{task_id}/events", json={"events": []})).status_code == 400
    await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    late = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("x", "late")})
    assert late.status_code == 409 and error_of(late) == "conflict"


async def test_completion_is_idempotent_and_a_different_outcome_conflicts(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    failure = {"error": {"code": "router_failed", "message": "planning failed"}}
    first = await operator.post(f"/v1/tasks/{task_id}/complete", json=failure)
    assert first.status_code == 200
    response = first.json()["response"]
    assert response["status"] == "failed"
    assert response["content"]["meta"]["error"] == {"code": "router_failed", "message": "planning failed"}
    again = await operator.post(f"/v1/tasks/{task_id}/complete", json=failure)
    assert again.status_code == 200 and again.json()["response"]["revision"] == response["revision"]
    different = await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    assert different.status_code == 409 and error_of(different) == "conflict"
    async with rig.db.transaction(read_only=True) as tx:
        ops = [e.event["op"] for e in await tx.message_events.read(response["id"])]
    assert ops == ["start", "error", "end"]  # written once


async def test_completion_events_land_with_the_end_once_and_are_checked(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    answer = [{"op": "set", "block": {"id": "answer", "type": "text", "content": "forty-two"}}]
    refused: list[list[dict[str, Any]]] = [
        [{"op": "error", "error": {"code": "x", "message": "y"}}],  # a failure is the completion's error
        [{"op": "set", "block": {"id": "q", "type": "ask", "prompt": "?", "allow_other": True}}],  # no Human blocks
        [{"op": "end"}],
    ]
    for events in refused:
        response = await operator.post(f"/v1/tasks/{task_id}/complete", json={"events": events})
        assert response.status_code == 400 and error_of(response) == "invalid_request", events
    assert (await task_object(rig, task_id)) is not None  # a refused completion changed nothing
    done = await operator.post(f"/v1/tasks/{task_id}/complete", json={"events": answer})
    assert done.status_code == 200, done.text
    response = done.json()["response"]
    assert response["status"] == "completed"
    assert response["content"]["blocks"] == [{"id": "answer", "type": "text", "content": "forty-two"}]
    again = await operator.post(
        f"/v1/tasks/{task_id}/complete",
        json={"events": [{"op": "append", "mask": "block.content", "block": {"id": "answer", "content": "!"}}]},
    )
    assert again.status_code == 200 and again.json()["response"]["revision"] == response["revision"]
    async with rig.db.transaction(read_only=True) as tx:
        ops = [e.event["op"] for e in await tx.message_events.read(response["id"])]
    assert ops == ["start", "set", "end"]  # the answer and the end, once


async def test_completion_events_are_not_applied_when_the_completion_is_refused(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    assert (
        await operator.post(f"/v1/tasks/{task_id}/complete", json={"error": {"code": "a", "message": "b"}})
    ).is_success
    late = await operator.post(
        f"/v1/tasks/{task_id}/complete",
        json={"events": [{"op": "set", "block": {"id": "answer", "type": "text", "content": "late"}}]},
    )
    assert late.status_code == 409 and error_of(late) == "conflict"
    async with rig.db.transaction(read_only=True) as tx:
        response = (await tx.messages.task_pair(task_id))[1]
        ops = [e.event["op"] for e in await tx.message_events.read(response.id)]
    assert ops == ["start", "error", "end"]


async def test_a_completion_closes_its_delivery_by_one_compare_and_set(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The response as the completion's first transaction left it (ended: its revision moved) is what the closing
    compare-and-set expects, so the last transaction is that one UPDATE: no conflict, no read and lock again."""
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    transactions = _record_transactions(rig, monkeypatch)
    done = await rig.task_api.complete(task_id)
    assert done.delivery_state == "closed" and done.status == "completed"
    closing = transactions[-1]
    assert len(closing) == 1 and closing[0].startswith("UPDATE messages SET delivery_state"), closing


async def test_a_completion_ends_its_response_and_stores_its_intent_in_one_write_of_the_row(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completion's first transaction writes the response row once: its end (status and content) with the
    intent (``closing`` and the completion) — also for a failure, and when the response had ended before."""
    user = rig.client()
    cid = await new_conversation(user)
    asked = [await ask(user, cid, text) for text in ("one", "two", "three")]
    ok, failed, ended = (a["task_id"] for a in asked)
    error = {"code": "boom", "message": "it broke"}
    async with rig.db.transaction() as tx:  # the third's stream ended before its completion
        await finish(tx, asked[2]["response"]["id"], "completed")
    for task_id, intent, status in ((ok, None, "completed"), (failed, error, "failed"), (ended, None, "completed")):
        transactions = _record_transactions(rig, monkeypatch)
        done = await rig.task_api.complete(task_id, error=intent)
        monkeypatch.undo()
        assert (done.status, done.delivery_state, done.completion) == (status, "closed", {"error": intent})
        first = next(t for t in transactions if any(s.startswith("UPDATE messages") for s in t))
        assert sum(s.startswith("UPDATE messages") for s in first) == 1, first


async def test_a_question_knows_the_cursor_before_it_without_reading_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor a question returns is the stream position just before its input's start (a stream from it shows
    the question and its answer), taken from the events the question stored — its transaction reads no counter, and
    advances it once for the opening events of both its messages."""
    user = rig.client()
    cid = await new_conversation(user)
    first = await ask(user, cid, "one")
    async with rig.db.transaction(read_only=True) as tx:
        before = await tx.message_events.last_cursor(cid)
    transactions = _record_transactions(rig, monkeypatch)
    second = await ask(user, cid, "two")
    monkeypatch.undo()
    assert first["cursor"] == 0 and second["cursor"] == before > 0
    assert not [s for t in transactions for s in t if s.startswith("SELECT last_cursor")]
    # its input's and its response's opening events advance the conversation's counter once
    assert sum(s.startswith("UPDATE conversation_cursors") for t in transactions for s in t) == 1
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(cid, after_cursor=second["cursor"])
    assert events[0].message_id == second["input"]["id"] and events[0].event["op"] == "start"
    assert {e.message_id for e in events} == {second["input"]["id"], second["response"]["id"]}


async def test_a_completion_given_its_response_does_not_look_it_up_and_checks_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A responder that knows the Task's response (its call's message) names it: the completion locks it without
    looking the Task's messages up first. A message that is not that Task's response is not trusted: the Task's
    own response is found and completed as usual."""
    user = rig.client()
    cid = await new_conversation(user)
    first = await ask(user, cid, "one")
    second = await ask(user, cid, "two")
    transactions = _record_transactions(rig, monkeypatch)
    done = await rig.task_api.complete(first["task_id"], response_id=first["response"]["id"])
    assert done.id == first["response"]["id"] and done.delivery_state == "closed" and done.status == "completed"
    assert not [s for t in transactions for s in t if "purpose IN ('input', 'response')" in s]
    transactions.clear()
    # the other question's response (or its input) named for the second Task: not its own, so looked up
    done = await rig.task_api.complete(second["task_id"], response_id=first["response"]["id"])
    assert done.id == second["response"]["id"] and done.status == "completed"
    assert [s for t in transactions for s in t if "purpose IN ('input', 'response')" in s]
    monkeypatch.undo()
    assert (await rig.task_api.response_of(first["task_id"])).status == "completed"


async def test_a_crash_between_closing_and_closed_is_finished_by_the_sweeper(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    output = await rig.task_api.open_output(task_id, actor_kind="harness", actor_key="assistant", title="work/0")
    rig.gateway.fail_delete = TaskUnavailable("the resource API is down")
    failed = await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    assert failed.status_code == 503 and error_of(failed) == "service_unavailable"
    response = await rig.task_api.response_of(task_id)
    async with rig.db.transaction(read_only=True) as tx:
        output_now = await tx.messages.get(output.id)
    assert response.delivery_state == "closing" and response.status == "completed"  # finalized before the delete
    assert output_now.status == "completed"
    assert await task_object(rig, task_id) is not None
    assert (await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("x")})).status_code == 409
    assert await rig.task_api.sweep_closing() == 0  # still failing: stays closing
    rig.gateway.fail_delete = None
    assert await rig.task_api.sweep_closing() == 1
    assert await task_object(rig, task_id) is None
    assert (await rig.task_api.response_of(task_id)).delivery_state == "closed"
    assert await rig.task_api.sweep_closing() == 0
    retried = await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    assert retried.status_code == 200 and retried.json()["delivery_state"] == "closed"


async def test_the_sweeper_runs_in_the_background(rig: Rig) -> None:
    import asyncio

    from loopd.server.chat import Sweeper

    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    rig.gateway.fail_delete = TaskUnavailable("down")
    with pytest.raises(TaskUnavailable):
        await rig.task_api.complete(task_id)
    rig.gateway.fail_delete = None
    clock = VirtualClock()
    sweeper = Sweeper("test", lambda: rig.task_api.sweep_closing(limit=5), interval=1.0, clock=clock)
    async with asyncio.TaskGroup() as group:
        running = group.create_task(sweeper.run())
        try:
            async with asyncio.timeout(30):
                while (await rig.task_api.response_of(task_id)).delivery_state != "closed":
                    await clock.advance(1.0)  # the next tick comes due
        finally:
            running.cancel()
    assert running.cancelled() and sweeper.ticks >= 1 and await task_object(rig, task_id) is None


async def test_follow_up_messages_while_work_continues(rig: Rig) -> None:
    user = rig.client()
    operator = rig.operator()
    cid = await new_conversation(user)
    first = await ask(user, cid, "write a report")
    await operator.post(f"/v1/tasks/{first['task_id']}/events", json={"events": text_events("a", "working")})
    second = await ask(user, cid, "also include charts")  # while the first is still streaming
    assert second["task_id"] != first["task_id"]
    follow = (await operator.get(f"/v1/tasks/{first['task_id']}/followups")).json()["data"]
    assert [m["id"] for m in follow] == [second["input"]["id"]]
    assert follow[0]["content"]["blocks"][0]["content"] == "also include charts"
    history = (await operator.get(f"/v1/tasks/{second['task_id']}")).json()["history"]
    assert [m["id"] for m in history] == [
        first["input"]["id"],
        first["response"]["id"],
        second["input"]["id"],
    ]
    assert history[1]["status"] == "streaming"  # the first answer is still in progress
    # Both answers proceed independently.
    await operator.post(f"/v1/tasks/{second['task_id']}/complete", json={})
    await operator.post(
        f"/v1/tasks/{first['task_id']}/events",
        json={"events": [{"op": "append", "mask": "block.content", "block": {"id": "a", "content": " done"}}]},
    )
    done = (await operator.post(f"/v1/tasks/{first['task_id']}/complete", json={})).json()
    assert done["response"]["content"]["blocks"][0]["content"] == "working done"


async def test_the_task_api_is_for_the_tasks_responder(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    stranger = rig.client(actor="operator:router")
    for method, path, body in [
        ("GET", f"/v1/tasks/{task_id}", None),
        ("GET", f"/v1/tasks/{task_id}?messages=100", None),  # the Task's own messages: its responder only
        ("GET", f"/v1/tasks/{task_id}/messages", None),
        ("POST", f"/v1/tasks/{task_id}/events", {"events": text_events("x")}),
        ("POST", f"/v1/tasks/{task_id}/complete", {}),
    ]:
        response = await stranger.request(method, path, json=body)
        assert response.status_code == 403, path
    # Not even the admin user acts for a Task as itself; it may only speak as the Task's responder.
    assert (await rig.client().get(f"/v1/tasks/{task_id}")).status_code == 403
    assert (await rig.operator().get(f"/v1/tasks/{task_id}")).status_code == 200
    assert (await rig.operator().get("/v1/tasks/unknown-task")).status_code == 404


async def test_outputs_live_in_the_work_conversation_readable_by_the_asker(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    output = await rig.task_api.open_output(task_id, actor_kind="harness", actor_key="assistant", title="plan")
    again = await rig.task_api.open_output(task_id, actor_kind="harness", actor_key="assistant")
    assert output.conversation_id == again.conversation_id != cid
    work = (await user.get(f"/v1/conversations?task_id={task_id}")).json()["data"]
    assert [c["id"] for c in work] == [output.conversation_id]
    assert work[0]["actor_kind"] == "operator" and work[0]["task_id"] == task_id
    messages = (await user.get(f"/v1/conversations/{output.conversation_id}/messages")).json()["data"]
    assert [m["purpose"] for m in messages] == ["output", "output"]
    assert messages[0]["content"]["meta"] == {"title": "plan"}
    assert [c["id"] for c in (await user.get("/v1/conversations")).json()["data"]] == [cid]  # not listed
    task_messages = (await rig.operator().get(f"/v1/tasks/{task_id}/messages")).json()["data"]
    assert len(task_messages) == 4
    other = rig.client(token=False, cookie="ff" * 32)
    assert (await other.get(f"/v1/conversations/{output.conversation_id}")).status_code == 404
    assert (await other.get(f"/v1/conversations?task_id={task_id}")).json()["data"] == []
    done = await rig.task_api.complete(task_id, error={"code": "stopped", "message": "by test"})
    assert done.status == "failed"
    async with rig.db.transaction(read_only=True) as tx:
        assert (await tx.messages.get(output.id)).status == "failed"


async def test_messages_page_by_id(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    for i in range(3):
        await ask(user, cid, f"q{i}")
    page = (await user.get(f"/v1/conversations/{cid}/messages?limit=4")).json()
    assert len(page["data"]) == 4 and page["next_after"] == page["data"][-1]["id"]
    rest = (await user.get(f"/v1/conversations/{cid}/messages?after={page['next_after']}&limit=4")).json()
    assert len(rest["data"]) == 2 and rest["next_after"] is None
    ids = [m["id"] for m in page["data"] + rest["data"]]
    assert ids == sorted(ids) and len(set(ids)) == 6


async def test_history_is_bounded_and_says_when_there_is_more(rig: Rig) -> None:
    from loopd.server.chat import TaskApi

    user = rig.client()
    cid = await new_conversation(user)
    for i in range(3):
        await ask(user, cid, f"q{i}")
    last = await ask(user, cid, "last")
    short = TaskApi(rig.db, rig.ctx.bus, rig.gateway, history_limit=3)
    context = await short.task_context(last["task_id"])
    assert [m.id for m in context.history][-1] == last["input"]["id"]
    assert len(context.history) == 3 and context.has_earlier is True
    full = await rig.task_api.task_context(last["task_id"])
    assert len(full.history) == 7 and full.has_earlier is False
