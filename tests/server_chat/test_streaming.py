"""Conversation streams over a real socket: ack + answer, disconnect and resume with Last-Event-ID (no loss, no
duplicates), snapshot == fold of the events, heartbeats, observing a question, disconnects disturb nothing."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest

from loopd._infra.http import LastChunk
from loopd._infra.sse import parse_sse, split_sse
from loopd.server.chat import ConversationReader, conversation_frames, text_content
from loopd.server.chat._records import StreamPage
from loopd.server.http._identity import Identity
from tests.server_http.support import (
    Frame,
    Rig,
    ask,
    build_rig,
    fold_by_message,
    frames_of,
    new_conversation,
    real_client,
    served,
    text_events,
)
from tests.support.waiting import eventually

SSE = {"Accept": "text/event-stream"}


ALICE = Identity("user", "alice")


async def _log(rig: Rig, conversation_id: str) -> list[tuple[int, str, int, dict[str, Any]]]:
    async with rig.db.transaction(read_only=True) as tx:
        events = await tx.message_events.read_conversation_events(conversation_id)
    return [(e.cursor, e.message_id, e.seq, e.event) for e in events]


def _entries(frames: list[Frame]) -> list[tuple[int, str, int, dict[str, Any]]]:
    out = []
    for frame in frames:
        if frame.id is not None:
            assert frame.data is not None
            out.append((frame.id, frame.data["message_id"], frame.data["seq"], frame.data["event"]))
    return out


async def _ask_answered(user: httpx.AsyncClient, operator: httpx.AsyncClient, cid: str, frames: list[Frame]) -> str:
    """Ask the echo operator over a streamed request; once acked, answer "ok" and complete. Every frame the stream
    sent goes into ``frames``; returns the task id."""
    body = {"target": {"kind": "operator", "key": "echo"}, "text": "hi"}
    async with (
        asyncio.timeout(10),
        user.stream("POST", f"/v1/conversations/{cid}/messages", json=body, headers=SSE) as response,
    ):
        task_id = response.headers["X-Loopd-Task-ID"]
        async for frame in frames_of(response):
            frames.append(frame)
            if frame.event == "ack":
                await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a", "ok")})
                await operator.post(f"/v1/tasks/{task_id}/complete", json={})
    return str(task_id)


async def test_a_streamed_chat_request_acks_then_streams_the_answer_until_it_ends(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        frames: list[Frame] = []
        answering: asyncio.Task[None] | None = None

        async def answer(task_id: str) -> None:
            for piece in ("Hel", "lo"):
                events = [
                    {"op": "append", "mask": "block.content", "block": {"id": "a", "type": "text", "content": piece}}
                ]
                assert (await operator.post(f"/v1/tasks/{task_id}/events", json={"events": events})).status_code == 200
            assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200

        body = {"target": {"kind": "operator", "key": "echo"}, "text": "hi"}
        async with (
            asyncio.timeout(10),
            user.stream("POST", f"/v1/conversations/{cid}/messages", json=body, headers=SSE) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            task_id = response.headers["X-Loopd-Task-ID"]
            async for frame in frames_of(response):
                frames.append(frame)
                if frame.event == "ack":
                    answering = asyncio.ensure_future(answer(task_id))
        assert answering is not None
        await answering
    ack = frames[0]
    assert ack.event == "ack" and ack.id is None and ack.data is not None
    assert ack.data["task_id"] == task_id and ack.data["cursor"] == 0
    entries = _entries(frames[1:])
    assert entries == await _log(rig, cid)  # the whole question, nothing else, in order
    by_message = {
        m: [e[3]["op"] for e in entries if e[1] == m]
        for m in (ack.data["input_message_id"], ack.data["response_message_id"])
    }
    assert by_message[ack.data["input_message_id"]] == ["start", "end"]
    assert by_message[ack.data["response_message_id"]] == ["start", "append", "append", "end"]
    starts = [f.data for f in frames if f.data is not None and f.data.get("event", {}).get("op") == "start"]
    assert {s["message"]["purpose"] for s in starts} == {"input", "response"}
    end = frames[-1].data
    assert end is not None and end["event"]["op"] == "end" and end["message"]["status"] == "completed"


async def test_disconnect_mid_answer_then_resume_with_last_event_id_loses_and_repeats_nothing(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid, "count")
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]
        await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("n", "1", "2", "3")})
        first: list[Frame] = []
        async with asyncio.timeout(10):
            async with user.stream("GET", f"/v1/conversations/{cid}/stream?after={accepted['cursor']}") as response:
                async for frame in frames_of(response):
                    first.append(frame)
                    if len(_entries(first)) == 5:
                        break  # the client goes away in the middle of the answer
            # Work goes on while nobody watches.
            await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("m", "4", "5")})
            assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
            last_id = _entries(first)[-1][0]
            second: list[Frame] = []
            headers = {"Last-Event-ID": str(last_id)}
            async with user.stream("GET", f"/v1/conversations/{cid}/stream", headers=headers) as response:
                async for frame in frames_of(response):
                    second.append(frame)
                    if frame.data and frame.data["message_id"] == response_id and frame.data["event"]["op"] == "end":
                        break
        union = _entries(first) + _entries(second)
        assert union == await _log(rig, cid)  # gap-free and no duplicates
        assert len({e[0] for e in union}) == len(union)
        # Reloading the snapshot gives what folding the events gives.
        snapshot = (await user.get(f"/v1/conversations/{cid}/snapshot")).json()
        assert snapshot["cursor"] == union[-1][0]
        folded = fold_by_message([{"message_id": e[1], "event": e[3]} for e in union])
        assert {m["id"]: m["content"] for m in snapshot["messages"]} == folded
        answer = folded[response_id]["blocks"]
        assert [b["content"] for b in answer] == ["123", "45"]


async def test_snapshot_then_stream_from_its_cursor_is_the_same_as_streaming_from_the_start(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        await operator.post(f"/v1/tasks/{accepted['task_id']}/events", json={"events": text_events("a", "x")})
        snapshot = (await user.get(f"/v1/conversations/{cid}/snapshot")).json()
        await operator.post(f"/v1/tasks/{accepted['task_id']}/events", json={"events": text_events("b", "y")})
        await operator.post(f"/v1/tasks/{accepted['task_id']}/complete", json={})
        tail: list[Frame] = []
        async with (
            asyncio.timeout(10),
            user.stream("GET", f"/v1/conversations/{cid}/stream?after={snapshot['cursor']}") as response,
        ):
            async for frame in frames_of(response):
                tail.append(frame)
                if frame.data and frame.data["event"]["op"] == "end":
                    break
        log = await _log(rig, cid)
        assert _entries(tail) == [e for e in log if e[0] > snapshot["cursor"]]
        from loopd.agentue import StreamState, reduce

        state = {m["id"]: StreamState.of(m["content"], seq=None) for m in snapshot["messages"]}
        for _, message_id, _, event in _entries(tail):
            state[message_id] = reduce(state[message_id], event)
        final = (await user.get(f"/v1/conversations/{cid}/snapshot")).json()
        assert {m["id"]: m["content"] for m in final["messages"]} == {
            k: v.model.to_json() for k, v in state.items() if v.model is not None
        }


async def test_the_stream_sends_heartbeats_and_wakes_on_new_events(rig: Rig) -> None:
    clock = rig.clock  # heartbeats and the feed's 5 s poll run on virtual time: they come when the test says
    quick = build_rig(rig.db, clock, heartbeat=0.2, poll_interval=5.0, bus_clock=clock)
    async with served(quick) as url:
        user = real_client(quick, url)
        operator = real_client(quick, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        seen: list[Frame] = []

        async def read() -> None:
            async with user.stream("GET", f"/v1/conversations/{cid}/stream") as response:
                async for frame in frames_of(response):
                    seen.append(frame)
                    if frame.id is not None:
                        return

        def heartbeats() -> int:
            return len([f for f in seen if f.comments])

        begin = clock.monotonic()

        async def beat(count: int) -> None:
            due = begin + 0.2 * count
            # The stream is caught up (it started at the current end) and its heartbeat timer is armed.
            await eventually(lambda: clock.next_deadline == due, what="the heartbeat timer")
            await clock.advance(0.2)
            await eventually(lambda: heartbeats() == count, what=f"heartbeat {count}")

        async with asyncio.timeout(10):
            reading = asyncio.ensure_future(read())
            await beat(1)
            await beat(2)
            assert not any(f.id for f in seen)
            posted_at = clock.monotonic()
            await operator.post(f"/v1/tasks/{accepted['task_id']}/events", json={"events": text_events("a")})
            await reading  # the event arrives with virtual time standing still: the bus woke the feed, not its poll
        assert clock.monotonic() == posted_at < begin + 5.0
        assert seen[0].comments == ("ping",) and heartbeats() == 2
        assert seen[-1].data is not None and seen[-1].data["event"]["op"] == "set"
    await quick.aclose()


async def test_observing_an_existing_question_by_task_id(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        await ask(user, cid, "earlier")
        accepted = await ask(user, cid, "this one")
        task_id = accepted["task_id"]
        await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a", "ok")})
        await operator.post(f"/v1/tasks/{task_id}/complete", json={})
        observed = await user.post(f"/v1/conversations/{cid}/messages", json={"task_id": task_id})
        assert observed.status_code == 200 and observed.json()["cursor"] == accepted["cursor"]
        frames: list[Frame] = []
        async with (
            asyncio.timeout(10),
            user.stream(
                "POST", f"/v1/conversations/{cid}/messages", json={"task_id": task_id}, headers=SSE
            ) as response,
        ):
            assert response.headers["X-Loopd-Task-ID"] == task_id
            frames = [frame async for frame in frames_of(response)]  # ends by itself: the answer is complete
        log = await _log(rig, cid)
        assert _entries(frames) == [e for e in log if e[0] > accepted["cursor"]]
        last = _entries(frames)[-1][0]
        async with (
            asyncio.timeout(10),
            user.stream(
                "POST",
                f"/v1/conversations/{cid}/messages",
                json={"task_id": task_id},
                headers={**SSE, "Last-Event-ID": str(last)},
            ) as response,
        ):
            rest = [frame async for frame in frames_of(response)]
        assert [f.event for f in rest] == ["ack"]  # everything was already seen: ack, then the stream ends
        bad = await user.post(f"/v1/conversations/{cid}/messages", json={"task_id": "nope"})
        assert bad.status_code == 404
        wrong = await user.get(f"/v1/conversations/{cid}/stream", headers={"Last-Event-ID": "abc"})
        assert wrong.status_code == 400


async def test_client_disconnects_never_affect_the_answer_or_other_readers(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        operator = real_client(rig, url, actor="operator:echo")
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        task_id, response_id = accepted["task_id"], accepted["response"]["id"]

        async def reader(leave_after: int | None, got: list[Frame]) -> list[Frame]:
            async with (
                httpx.AsyncClient(base_url=url, headers=dict(user.headers), timeout=10) as own,
                own.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response,
            ):
                async for frame in frames_of(response):
                    got.append(frame)
                    if leave_after is not None and len(got) >= leave_after:
                        return got
                    if frame.data and frame.data["message_id"] == response_id and frame.data["event"]["op"] == "end":
                        return got
            return got

        async with asyncio.timeout(15):
            gots: list[list[Frame]] = [[] for _ in range(5)]
            readers = [
                asyncio.ensure_future(reader(n, got)) for n, got in zip((1, 2, 3, None, None), gots, strict=True)
            ]
            # Every reader is connected (it has its first frame) before the answer streams; some then leave.
            await eventually(lambda: all(gots), what="every reader's first frame")
            for piece in "abc":
                response = await operator.post(
                    f"/v1/tasks/{task_id}/events", json={"events": text_events(piece, piece)}
                )
                assert response.status_code == 200
            assert (await operator.post(f"/v1/tasks/{task_id}/complete", json={})).status_code == 200
            results = await asyncio.gather(*readers)
        log = await _log(rig, cid)
        for got in results[3:]:
            assert _entries(got) == log
        # Every reader leaves the bus (the server notices a disconnect promptly).
        await eventually(lambda: rig.ctx.bus.watched == 0, timeout=30, what="every reader to leave the bus")


async def test_a_database_failure_under_an_open_stream_ends_it_with_an_error_event(rig: Rig) -> None:
    async with served(rig) as url:
        user = real_client(rig, url)
        cid = await new_conversation(user)
        accepted = await ask(user, cid)
        frames: list[Frame] = []
        async with asyncio.timeout(10), user.stream("GET", f"/v1/conversations/{cid}/stream?after=0") as response:
            async for frame in frames_of(response):
                frames.append(frame)
                if len(_entries(frames)) == 3:  # input start, end, response start: now the database goes away
                    await rig.db.aclose()
        assert frames[-1].event == "error" and frames[-1].data is not None
        assert frames[-1].data["error"]["type"] == "service_unavailable"
        assert frames[-1].data["resume_after"] == _entries(frames)[-1][0]
        assert accepted["task_id"]


async def test_a_question_asked_now_does_not_look_up_whether_its_answer_ended_before_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its whole stream comes after the cursor taken in its own transaction, so that read is skipped; observing an
    # existing question (which may have ended before the client's cursor) still makes it.
    looked_up: list[str] = []
    original = ConversationReader.end_cursor

    async def counting(self: ConversationReader, message_id: str) -> int | None:
        looked_up.append(message_id)
        return await original(self, message_id)

    monkeypatch.setattr(ConversationReader, "end_cursor", counting)
    async with served(rig) as url:
        user = real_client(rig, url)
        cid = await new_conversation(user)
        task_id = await _ask_answered(user, real_client(rig, url, actor="operator:echo"), cid, [])
        assert looked_up == []
        async with (
            asyncio.timeout(10),
            user.stream("POST", f"/v1/conversations/{cid}/messages", json={"task_id": task_id}, headers=SSE) as again,
        ):
            assert [frame async for frame in frames_of(again)]
        assert len(looked_up) == 1


async def test_a_question_streams_its_own_events_without_reading_them_back(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The question's transaction knows the events it stored right after its cursor (its input's start and end, its
    response's start, each with its header as that commit left it): the stream opens with them, read from nowhere,
    and reads the log only for what comes after. What it sends is the log, in order, nothing missing or repeated."""
    pages: list[int] = []
    original = ConversationReader.read_stream_page

    async def counting(self: ConversationReader, conversation_id: str, *, after: int, limit: int = 500) -> Any:
        pages.append(after)
        return await original(self, conversation_id, after=after, limit=limit)

    monkeypatch.setattr(ConversationReader, "read_stream_page", counting)
    async with served(rig) as url:
        user = real_client(rig, url)
        cid = await new_conversation(user)
        frames: list[Frame] = []
        await _ask_answered(user, real_client(rig, url, actor="operator:echo"), cid, frames)
    entries = _entries(frames[1:])
    assert entries == await _log(rig, cid)
    assert 0 not in pages  # the question's own events were not read back
    starts = [f.data for f in frames if f.data is not None and f.data.get("event", {}).get("op") == "start"]
    assert [s["message"]["status"] for s in starts] == ["completed", "streaming"]  # as the question stored them


async def test_the_ack_and_the_questions_own_events_go_out_as_one_chunk(rig: Rig) -> None:
    """What a question's transaction stored is known without a read, so the ack does not go out alone: one write
    carries it and those events (then the stream goes on as usual). Without that page, the ack goes out at once."""
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    known = StreamPage(list(asked.opened), asked.opened[-1].event.cursor)
    ack = {"response_message_id": asked.response.id}
    reader = ConversationReader(rig.db, rig.ctx.bus, poll_interval=5.0)
    try:
        for first, expected in ((known, ["ack", *[str(o.event.cursor) for o in asked.opened]]), (None, ["ack"])):
            frames = conversation_frames(
                reader,
                conversation.id,
                after=asked.cursor,
                heartbeat=30.0,
                until_message_id=asked.response.id,
                ack=ack,
                may_have_ended=False,
                first=first,
            )
            async with contextlib.aclosing(frames):
                chunk = await asyncio.wait_for(anext(frames), 10)
            found, rest = split_sse(chunk.decode())
            assert rest == ""
            assert [parse_sse(text).event or parse_sse(text).id for text in found] == expected
    finally:
        await reader.feeds.aclose()


async def test_the_chunk_that_ends_a_chat_requests_stream_is_its_last_chunk(rig: Rig) -> None:
    """The response's ``end`` goes out as a `LastChunk`: written with the HTTP response's own end, in one write."""
    conversation = await rig.chat.create_conversation(ALICE)
    asked = await rig.chat.ask(
        ALICE, conversation.id, target_kind="operator", target_key="echo", content=text_content("x")
    )
    await rig.task_api.complete(asked.task_id)
    reader = ConversationReader(rig.db, rig.ctx.bus, poll_interval=5.0)
    try:
        frames = conversation_frames(
            reader, conversation.id, after=asked.cursor, heartbeat=30.0, until_message_id=asked.response.id
        )
        chunks = [chunk async for chunk in frames]
    finally:
        await reader.feeds.aclose()
    assert chunks and all(type(chunk) is bytes for chunk in chunks[:-1])
    assert type(chunks[-1]) is LastChunk
    found, _ = split_sse(chunks[-1].decode())
    assert '"op":"end"' in found[-1] and asked.response.id in found[-1]
