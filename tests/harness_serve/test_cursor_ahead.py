"""`GET …/events` refuses a resume point past the session's last stored event (400 ``cursor_ahead``), for a live
and for a dormant session, by ``Last-Event-ID`` and by ``from_seq``; the head itself still resumes."""

from __future__ import annotations

import asyncio

from loopd.harness import SqliteJournal

from .conftest import Served, scripted_rig, serving, text_reply
from .test_errors_and_auth import assert_envelope
from .test_streaming import frames_until


async def _assert_refuses_cursors_past(served: Served, session_id: str, last_seq: int) -> None:
    path = f"/v1/sessions/{session_id}/events"
    for headers, params in (
        ({"Last-Event-ID": str(last_seq + 1)}, {}),
        ({"Last-Event-ID": str(last_seq + 3)}, {}),
        ({}, {"from_seq": last_seq + 2}),
        ({"Last-Event-ID": str(last_seq + 1)}, {"from_seq": 1}),  # Last-Event-ID wins, and is checked
    ):
        answer = await served.client.get(path, headers=headers, params=params)
        assert_envelope(answer, 400, "cursor_ahead")
    for headers, params in (({"Last-Event-ID": str(last_seq)}, {}), ({}, {"from_seq": last_seq + 1})):
        async with asyncio.timeout(30), served.client.stream("GET", path, headers=headers, params=params) as ok:
            assert ok.status_code == 200


async def test_a_cursor_past_the_head_is_refused_live_and_dormant(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("hello")])) as served:
        session_id = (await served.client.post("/v1/sessions", json={"input": "hi"})).json()["id"]
        await frames_until(served, f"/v1/sessions/{session_id}/events?from_seq=1", "turn_done")
        last_seq = (await served.client.get(f"/v1/sessions/{session_id}")).json()["last_seq"]
        assert last_seq > 1
        assert served.registry.live(session_id) is not None
        await _assert_refuses_cursors_past(served, session_id, last_seq)
    async with serving(scripted_rig(journal, [])) as served:  # a new server: the session is dormant here
        assert served.registry.live(session_id) is None
        last_seq = (await served.client.get(f"/v1/sessions/{session_id}")).json()["last_seq"]  # stopping adds one
        await _assert_refuses_cursors_past(served, session_id, last_seq)
