"""Speak / Tell over HTTP: keyed outputs in the main and work conversations, events, one end, idempotency."""

from __future__ import annotations

import asyncio
from typing import Any

from loopd.agentue import fold
from tests.server_http.support import ask, error_of, new_conversation, text_events

from .conftest import Api


async def _task(api: Api, text: str = "hello") -> dict[str, Any]:
    user = api.user()
    return await ask(user, await new_conversation(user), text)


async def _messages(api: Api, conversation_id: str) -> list[dict[str, Any]]:
    response = await api.user().get(f"/v1/conversations/{conversation_id}/messages")
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def test_speak_to_main_is_a_completed_reply_by_the_operator(api: Api) -> None:
    asked = await _task(api)
    operator = api.operator()
    spoken = await operator.post(
        f"/v1/tasks/{asked['task_id']}/outputs", json={"key": "hello", "conversation": "main", "text": "Hi there"}
    )
    assert spoken.status_code == 201, spoken.text
    body = spoken.json()
    assert body["created"] is True
    message = body["message"]
    assert (message["kind"], message["key"], message["purpose"]) == ("operator", "echo", "output")
    assert message["status"] == "completed" and message["task_id"] == asked["task_id"]
    assert message["conversation_id"] == asked["conversation_id"]
    assert message["reply_to_message_id"] == asked["input"]["id"]
    assert message["content"]["blocks"] == [{"id": "text", "type": "text", "content": "Hi there"}]
    listed = await _messages(api, asked["conversation_id"])
    assert [m["id"] for m in listed] == [asked["input"]["id"], asked["response"]["id"], message["id"]]
    async with api.rig.db.transaction(read_only=True) as tx:
        ops = [e.event["op"] for e in await tx.message_events.read(message["id"])]
    assert ops == ["start", "end"]


async def test_speak_to_work_opens_one_work_conversation(api: Api) -> None:
    asked = await _task(api)
    operator = api.operator()
    first = await operator.post(f"/v1/tasks/{asked['task_id']}/outputs", json={"key": "a", "text": "one"})
    second = await operator.post(
        f"/v1/tasks/{asked['task_id']}/outputs", json={"key": "b", "text": "two", "title": "Second"}
    )
    assert first.status_code == second.status_code == 201
    work_id = first.json()["message"]["conversation_id"]
    assert work_id != asked["conversation_id"]
    assert second.json()["message"]["conversation_id"] == work_id
    assert second.json()["message"]["content"]["meta"] == {"title": "Second"}
    assert first.json()["message"]["reply_to_message_id"] is None
    found = (await api.user().get("/v1/conversations", params={"task_id": asked["task_id"]})).json()["data"]
    assert [c["id"] for c in found] == [work_id]
    assert [m["content"]["blocks"][0]["content"] for m in await _messages(api, work_id)] == ["one", "two"]


async def test_tell_emit_end_and_the_end_is_given_once(api: Api) -> None:
    asked = await _task(api)
    task_id = asked["task_id"]
    operator = api.operator()
    opened = await operator.post(f"/v1/tasks/{task_id}/outputs", json={"key": "progress", "stream": True})
    assert opened.status_code == 201, opened.text
    message_id = opened.json()["message"]["id"]
    assert opened.json()["message"]["status"] == "streaming"
    emitted = await operator.post(
        f"/v1/tasks/{task_id}/outputs/{message_id}/events", json={"events": text_events("t", "Work", "ing")}
    )
    assert emitted.status_code == 200, emitted.text
    assert emitted.json()["message_id"] == message_id and emitted.json()["seq"] == 4

    ended = await operator.post(f"/v1/tasks/{task_id}/outputs/{message_id}/end", json={})
    assert ended.status_code == 200, ended.text
    final = ended.json()["message"]
    assert final["status"] == "completed"
    assert final["content"]["blocks"] == [{"id": "t", "type": "text", "content": "Working"}]
    again = await operator.post(f"/v1/tasks/{task_id}/outputs/{message_id}/end", json={"error": None})
    assert again.status_code == 200 and again.json()["message"]["revision"] == final["revision"]
    other = await operator.post(
        f"/v1/tasks/{task_id}/outputs/{message_id}/end", json={"error": {"code": "late", "message": "no"}}
    )
    assert other.status_code == 409 and error_of(other) == "conflict"
    late = await operator.post(
        f"/v1/tasks/{task_id}/outputs/{message_id}/events", json={"events": text_events("u", "late")}
    )
    assert late.status_code == 409 and error_of(late) == "conflict"
    async with api.rig.db.transaction(read_only=True) as tx:
        events = [e.event for e in await tx.message_events.read(message_id)]
        stored = await tx.messages.get(message_id)
    assert [e["op"] for e in events].count("end") == 1
    state = fold(events)
    assert state.model is not None and state.model.to_json() == stored.content


async def test_an_end_with_an_error_fails_the_output(api: Api) -> None:
    asked = await _task(api)
    operator = api.operator()
    opened = await operator.post(f"/v1/tasks/{asked['task_id']}/outputs", json={"key": "k", "stream": True})
    message_id = opened.json()["message"]["id"]
    error = {"code": "tool_failed", "message": "the tool broke"}
    url = f"/v1/tasks/{asked['task_id']}/outputs/{message_id}/end"
    ended = await operator.post(url, json={"error": error})
    assert ended.status_code == 200 and ended.json()["message"]["status"] == "failed"
    assert ended.json()["message"]["content"]["meta"]["error"]["code"] == "tool_failed"
    assert (await operator.post(url, json={"error": error})).status_code == 200
    assert (await operator.post(url, json={})).status_code == 409


async def test_the_same_key_is_the_same_message_and_other_parameters_conflict(api: Api) -> None:
    asked = await _task(api)
    url = f"/v1/tasks/{asked['task_id']}/outputs"
    operator = api.operator()
    body = {"key": "answer", "conversation": "main", "text": "42"}
    first = await operator.post(url, json=body)
    replay = await operator.post(url, json=body)
    assert first.status_code == 201 and replay.status_code == 200
    assert replay.json()["created"] is False and replay.json()["message"]["id"] == first.json()["message"]["id"]
    for changed in ({**body, "text": "43"}, {**body, "conversation": "work"}, {**body, "title": "T"}):
        refused = await operator.post(url, json=changed)
        assert refused.status_code == 409 and error_of(refused) == "conflict", changed
    main = await _messages(api, asked["conversation_id"])
    assert sum(1 for m in main if m["purpose"] == "output") == 1


async def test_concurrent_duplicates_store_one_message(api: Api) -> None:
    asked = await _task(api)
    url = f"/v1/tasks/{asked['task_id']}/outputs"
    operator = api.operator()
    body = {"key": "race", "text": "once"}
    answers = await asyncio.gather(*(operator.post(url, json=body) for _ in range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 7 + [201], [a.text for a in answers]
    assert len({a.json()["message"]["id"] for a in answers}) == 1
    async with api.rig.db.transaction(read_only=True) as tx:
        outputs = await tx.messages.find_by_purpose(asked["task_id"], "output")
    assert len(outputs) == 1


async def test_a_crash_after_the_commit_replays_to_the_stored_message(api: Api) -> None:
    """The key is stored with its message: a lost answer (the commit happened, the client never heard) replays
    to the same message; a commit that failed stored neither, so the retry creates it once."""
    asked = await _task(api)
    url = f"/v1/tasks/{asked['task_id']}/outputs"
    operator = api.operator()
    api.rig.db.fail_commits = 1  # type: ignore[attr-defined]  # the rig's CommitFailingDatabase
    failed = await operator.post(url, json={"key": "k", "text": "x"})
    assert failed.status_code == 503
    async with api.rig.db.transaction(read_only=True) as tx:
        assert await tx.messages.find_by_purpose(asked["task_id"], "output") == []
        assert await tx.task_outputs.find(asked["task_id"], "k") is None
    created = await operator.post(url, json={"key": "k", "text": "x"})
    assert created.status_code == 201
    replay = await operator.post(url, json={"key": "k", "text": "x"})
    assert replay.status_code == 200 and replay.json()["message"]["id"] == created.json()["message"]["id"]


async def test_after_completion_no_new_output_and_open_outputs_end(api: Api) -> None:
    asked = await _task(api)
    task_id = asked["task_id"]
    operator = api.operator()
    opened = await operator.post(f"/v1/tasks/{task_id}/outputs", json={"key": "open", "stream": True})
    message_id = opened.json()["message"]["id"]
    done = await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    assert done.status_code == 200 and done.json()["delivery_state"] == "closed"
    refused = await operator.post(f"/v1/tasks/{task_id}/outputs", json={"key": "new", "text": "late"})
    assert refused.status_code == 409 and error_of(refused) == "conflict"
    late = await operator.post(
        f"/v1/tasks/{task_id}/outputs/{message_id}/events", json={"events": text_events("x", "late")}
    )
    assert late.status_code == 409
    async with api.rig.db.transaction(read_only=True) as tx:
        assert (await tx.messages.get(message_id)).status == "completed"  # completion ended it
    # The end that matches how completion ended it is accepted (an operator ending its outputs late).
    ended = await operator.post(f"/v1/tasks/{task_id}/outputs/{message_id}/end", json={})
    assert ended.status_code == 200 and ended.json()["message"]["status"] == "completed"
    failed = await operator.post(
        f"/v1/tasks/{task_id}/outputs/{message_id}/end", json={"error": {"code": "x", "message": "y"}}
    )
    assert failed.status_code == 409


async def test_bad_bodies_are_400(api: Api) -> None:
    asked = await _task(api)
    url = f"/v1/tasks/{asked['task_id']}/outputs"
    operator = api.operator()
    model = {"version": "1.1", "biz": "x", "meta": {}, "blocks": [{"id": "a", "type": "text", "content": "hi"}]}
    bad: list[dict[str, Any]] = [
        {"text": "no key"},
        {"key": "", "text": "x"},
        {"key": "k" * 201, "text": "x"},
        {"key": "k"},  # a complete output without text or content
        {"key": "k", "text": "x", "content": model},
        {"key": "k", "conversation": "side", "text": "x"},
        {"key": "k", "content": {**model, "blocks": [{"id": "q", "type": "ask", "prompt": "?", "allow_other": True}]}},
        {"key": "k", "content": {**model, "meta": {"human": {}}}},
        {"key": "k", "content": {"version": "9", "biz": "x", "meta": {}, "blocks": []}},
        {"key": "k", "text": "x", "extra": 1},
    ]
    for body in bad:
        response = await operator.post(url, json=body)
        assert response.status_code == 400, (body, response.text)
        assert error_of(response) == "invalid_request"
    ok = await operator.post(url, json={"key": "k", "content": model})
    assert ok.status_code == 201 and ok.json()["message"]["content"]["biz"] == "x"
    message_id = ok.json()["message"]["id"]
    human = [{"op": "set", "block": {"id": "q", "type": "confirm", "prompt": "ok?"}}]
    opened = await operator.post(url, json={"key": "s", "stream": True})
    stream_id = opened.json()["message"]["id"]
    refused = await operator.post(f"{url}/{stream_id}/events", json={"events": human})
    assert refused.status_code == 400
    # Only outputs opened by key take events or an end here: not the response, not a missing message.
    for target in (asked["response"]["id"], "no-such-message"):
        missing = await operator.post(f"{url}/{target}/events", json={"events": text_events("a", "b")})
        assert missing.status_code == 404 and error_of(missing) == "not_found"
    assert (await operator.post(f"{url}/{message_id}/end", json={})).status_code == 200  # already complete: same end


async def test_only_the_responder_writes_outputs(api: Api) -> None:
    asked = await _task(api)
    task_id = asked["task_id"]
    url = f"/v1/tasks/{task_id}/outputs"
    opened = await api.operator().post(url, json={"key": "mine", "stream": True})
    message_id = opened.json()["message"]["id"]
    other = api.operator("someone-else")
    for path, body in (
        (url, {"key": "theirs", "text": "x"}),
        (url, {"key": "mine", "stream": True}),
        (f"{url}/{message_id}/events", {"events": text_events("a", "b")}),
        (f"{url}/{message_id}/end", {}),
    ):
        response = await other.post(path, json=body)
        assert response.status_code == 403 and error_of(response) == "forbidden", (path, response.text)
    user = api.user()  # the admin token speaking as the admin user is not the responder either
    assert (await user.post(url, json={"key": "u", "text": "x"})).status_code == 403
    unknown = await api.operator().post("/v1/tasks/no-such-task/outputs", json={"key": "k", "text": "x"})
    assert unknown.status_code == 404
