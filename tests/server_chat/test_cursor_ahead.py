"""A resume cursor past the conversation's last event is refused (400 ``cursor_ahead``), never followed: following
it would silently skip the events that later take those cursors."""

from __future__ import annotations

import asyncio

import httpx

from tests.server_http.support import (
    Frame,
    Rig,
    ask,
    error_of,
    frames_of,
    new_conversation,
    real_client,
    served,
    text_events,
)

SSE = {"Accept": "text/event-stream"}


async def _head(rig: Rig, conversation_id: str) -> int:
    async with rig.db.transaction(read_only=True) as tx:
        return await tx.message_events.last_cursor(conversation_id)


def _assert_cursor_ahead(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    assert error_of(response) == "cursor_ahead"
    assert response.json()["error"]["message"]


async def test_the_conversation_stream_refuses_a_cursor_past_the_head(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    await ask(user, cid, "hi")
    head = await _head(rig, cid)
    assert head > 0
    _assert_cursor_ahead(await user.get(f"/v1/conversations/{cid}/stream", headers={"Last-Event-ID": str(head + 3)}))
    _assert_cursor_ahead(await user.get(f"/v1/conversations/{cid}/stream?after={head + 1}"))
    # Last-Event-ID wins over ?after=, and is checked as well
    _assert_cursor_ahead(
        await user.get(f"/v1/conversations/{cid}/stream?after=0", headers={"Last-Event-ID": str(head + 1)})
    )


async def test_a_streamed_chat_request_refuses_a_cursor_past_the_head_before_asking(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    first = await ask(user, cid, "hi")
    head = await _head(rig, cid)
    body = {"target": {"kind": "operator", "key": "echo"}, "text": "again"}
    refused = await user.post(
        f"/v1/conversations/{cid}/messages", json=body, headers={**SSE, "Last-Event-ID": str(head + 1)}
    )
    _assert_cursor_ahead(refused)
    assert len(rig.gateway.created) == 1  # nothing was asked
    assert await _head(rig, cid) == head
    observe = {"task_id": first["task_id"]}
    _assert_cursor_ahead(
        await user.post(
            f"/v1/conversations/{cid}/messages", json=observe, headers={**SSE, "Last-Event-ID": str(head + 5)}
        )
    )


async def test_a_cursor_at_the_head_resumes_and_sees_every_later_event(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid, "count")
        head = await _head(rig, cid)
        frames: list[Frame] = []
        async with (
            asyncio.timeout(10),
            user.stream("GET", f"/v1/conversations/{cid}/stream", headers={"Last-Event-ID": str(head)}) as response,
        ):
            assert response.status_code == 200
            posted = await operator.post(
                f"/v1/tasks/{accepted['task_id']}/events", json={"events": text_events("n", "1")}
            )
            assert posted.status_code == 200
            async for frame in frames_of(response):
                if frame.id is not None:
                    frames.append(frame)
                if len(frames) == 2:
                    break
        assert [frame.id for frame in frames] == [head + 1, head + 2]
