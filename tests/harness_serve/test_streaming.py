"""The SSE stream: ids are journal seqs, ephemeral events carry none, resume is gap-free, heartbeats, overflow."""

from __future__ import annotations

import asyncio
import contextlib
import json

from loopd.harness import EchoTool, Reply, Rig, SqliteJournal
from loopd.harness.gate import Access, AccessConfig
from loopd.harness.models import ModelRequest
from loopd.harness.serve import create_app, sessions_of
from loopd.harness.serve._streaming import event_frames
from loopd.harness.serve._wire import CreateSessionRequest
from tests.support.waiting import eventually

from .conftest import Served, scripted_rig, serving, text_reply
from .sse import Frame, read_frames

STEPS = 4


def stepping_model(request: ModelRequest) -> Reply:
    """``STEPS`` steps that stream some text and call ``echo``, then a streamed final answer."""
    done = sum(1 for m in request.messages if m.role == "tool")
    if done < STEPS:
        return Reply(
            text=f"step {done + 1}: thinking out loud",
            chunk_size=4,
            chunk_delay=0.02,
            tool_calls=[("echo", {"text": f"n{done + 1}"})],
        )
    return Reply(text="all steps are done, here is the answer", chunk_size=3, chunk_delay=0.01)


def stepping_rig(journal: SqliteJournal) -> Rig:
    return scripted_rig(journal, stepping_model, tools=[EchoTool()], access=AccessConfig(tools={"echo": Access.ALLOW}))


async def frames_until(served: Served, path: str, stop: str, *, headers: dict[str, str] | None = None) -> list[Frame]:
    out: list[Frame] = []
    async with asyncio.timeout(30), served.client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for frame in read_frames(response):
            out.append(frame)
            if frame.event == stop:
                break
    return out


async def journal_seqs(journal: SqliteJournal, session_id: str) -> list[int]:
    return [r.seq for r in await journal.read(session_id)]


async def test_input_streams_tokens_then_turn_done(journal: SqliteJournal) -> None:
    rig = scripted_rig(journal, [text_reply("streamed answer", chunk_size=3, chunk_delay=0.005)])
    async with serving(rig) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        frames: list[Frame] = []
        async with asyncio.timeout(30), served.client.stream("GET", f"/v1/sessions/{session_id}/events") as response:
            posted = await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "hi"})
            assert posted.status_code == 202
            async for frame in read_frames(response):
                frames.append(frame)
                if frame.event == "turn_done":
                    break
        events = [f for f in frames if not f.is_ping]
        deltas = [f for f in events if f.event == "token_delta"]
        assert "".join(f.payload["event"]["text"] for f in deltas) == "streamed answer"
        assert all(f.id is None and f.payload["seq"] is None for f in deltas)
        stored = [f for f in events if f.event != "token_delta"]
        assert [f.event for f in stored] == ["turn_started", "context_measured", "turn_done"]
        assert [f.id for f in stored] == [2, 3, 4]  # the stream started after session_started (seq 1)
        assert stored[0].payload["event"]["inputs"][0]["command_id"] == posted.json()["command_id"]
        assert stored[2].payload == {
            "seq": 4,
            "kind": "turn_done",
            "lifecycle": "terminal",
            "loop": "main",
            "event": stored[2].payload["event"],
        }


async def test_dropped_stream_resumes_with_last_event_id_without_loss_or_duplicates(journal: SqliteJournal) -> None:
    async with serving(stepping_rig(journal)) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        first: list[Frame] = []
        async with (
            asyncio.timeout(30),
            served.client.stream("GET", f"/v1/sessions/{session_id}/events", params={"from_seq": 1}) as response,
        ):
            await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "work in steps"})
            async for frame in read_frames(response):
                first.append(frame)
                if frame.event == "step_done":
                    break  # drop the connection in the middle of the turn
        session = served.session(session_id)
        # The server notices the client left; the session is untouched.
        await eventually(lambda: not session.statistics().subscribers, timeout=30, what="the subscriber to leave")
        assert session.state.loops["main"].turn is not None, "the turn must still be running after the drop"
        last_id = max(f.id for f in first if f.id is not None)

        async def stored_beyond_the_drop() -> bool:
            return max(await journal_seqs(journal, session_id)) > last_id

        await eventually(stored_beyond_the_drop, what="events while nobody watches")
        second = await frames_until(
            served, f"/v1/sessions/{session_id}/events", "turn_done", headers={"Last-Event-ID": str(last_id)}
        )
        ids = [f.id for f in first + second if f.id is not None]
        assert len(ids) == len(set(ids)), f"duplicated seqs: {ids}"
        assert ids == await journal_seqs(journal, session_id)  # every stored event exactly once, in order
        assert second[-1].payload["event"]["text"] == "all steps are done, here is the answer"
        assert [f.event for f in first + second if f.id is not None].count("step_done") == STEPS


async def test_from_seq_replays_the_journal_and_ephemeral_events_are_live_only(journal: SqliteJournal) -> None:
    async with serving(stepping_rig(journal)) as served:
        session_id = (await served.client.post("/v1/sessions", json={"input": "go"})).json()["id"]
        await served.session(session_id).wait_idle(timeout=10)
        replay = await frames_until(served, f"/v1/sessions/{session_id}/events?from_seq=3", "turn_done")
        assert [f.id for f in replay if f.id is not None] == (await journal_seqs(journal, session_id))[2:]
        assert not [f for f in replay if f.event == "token_delta"]  # never stored, so never replayed


async def test_heartbeats_arrive_on_a_quiet_stream(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, []), heartbeat=0.1) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        pings = 0
        async with asyncio.timeout(30), served.client.stream("GET", f"/v1/sessions/{session_id}/events") as response:
            async for frame in read_frames(response):
                assert frame.is_ping, frame
                pings += 1
                if pings == 3:
                    break
        assert pings == 3


async def test_a_dormant_session_streams_from_the_journal_and_attaches_when_restored(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
    async with serving(scripted_rig(journal, [text_reply("woken up")]), heartbeat=0.2) as served:
        frames: list[Frame] = []
        async with (
            asyncio.timeout(30),
            served.client.stream("GET", f"/v1/sessions/{session_id}/events", params={"from_seq": 1}) as response,
        ):
            async for frame in read_frames(response):
                frames.append(frame)
                if frame.event == "session_stopped":
                    assert served.registry.live(session_id) is None  # reading did not restore it
                    posted = await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "wake"})
                    assert posted.status_code == 202
                if frame.event == "turn_done":
                    break
        kinds = [f.event for f in frames if f.id is not None]
        kinds = [k for k in kinds if k != "context_measured"]
        assert kinds == ["session_started", "session_stopped", "session_restored", "turn_started", "turn_done"]
        assert [f.id for f in frames if f.id is not None] == [1, 2, 3, 4, 5, 6]


async def test_an_overflowing_subscriber_gets_an_error_event_and_resumes_without_loss(journal: SqliteJournal) -> None:
    app = create_app(stepping_rig(journal), token=None)
    registry = sessions_of(app)
    try:
        created = await registry.create(CreateSessionRequest(), key=None)
        session = registry.live(created.session_id)
        assert session is not None
        frames = event_frames(registry, session.id, from_seq=2, heartbeat=5.0, queue_size=1)
        seen: list[bytes] = [await anext(frames)]  # retry:
        first = asyncio.ensure_future(anext(frames))  # subscribes (live: nothing to catch up) and waits
        # The reader subscribes, reads the (empty) rest of the journal on the journal's thread, then waits live.
        await eventually(lambda: session.log.hub.live_subscriber_count == 1, what="the reader to wait live")
        await session.submit("work in steps")
        seen.append(await first)  # turn_started; the subscription has room for one more event
        await session.wait_idle(timeout=10)  # the turn runs to its end while this reader is stalled
        async with asyncio.timeout(30):
            async for chunk in frames:
                seen.append(chunk)
        text = b"".join(seen).decode()
        assert "event: error" in text
        error_data = text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
        resume_from = json.loads(error_data)["error"]["resume_from"]
        ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
        assert ids == list(range(2, resume_from))
        assert resume_from < (await journal_seqs(journal, session.id))[-1]
        rest = event_frames(registry, session.id, from_seq=resume_from, heartbeat=5.0)
        async with contextlib.aclosing(rest):
            async with asyncio.timeout(30):
                async for chunk in rest:
                    ids += [int(line[4:]) for line in chunk.decode().splitlines() if line.startswith("id: ")]
                    if b"event: turn_done" in chunk:
                        break
        assert ids == (await journal_seqs(journal, session.id))[1:]
    finally:
        await registry.aclose()
