"""Creating, listing, viewing and restoring sessions; Idempotency-Key across a server restart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from loopd.harness import MemoryJournal, SqliteJournal
from loopd.harness.journal import NewRecord
from loopd.harness.serve import IDEMPOTENCY_FILE

from .conftest import scripted_rig, serving, text_reply
from .sse import Frame, read_frames


async def test_idempotency_key_returns_the_same_session_and_survives_a_restart(tmp_path: Path) -> None:
    keys = tmp_path / IDEMPOTENCY_FILE
    journal = await SqliteJournal.open(tmp_path / "journal.db")
    try:
        rig = scripted_rig(journal, [text_reply("first answer")])
        async with serving(rig, idempotency_path=keys) as served:
            first = await served.client.post(
                "/v1/sessions", json={"input": "hello"}, headers={"Idempotency-Key": "order-42"}
            )
            assert first.status_code == 201, first.text
            session_id = first.json()["id"]
            assert first.headers["location"] == f"/v1/sessions/{session_id}"
            command_id = first.json()["input_command_id"]
            assert command_id

            again = await served.client.post(
                "/v1/sessions", json={"input": "hello"}, headers={"Idempotency-Key": "order-42"}
            )
            assert again.status_code == 200
            assert again.json()["id"] == session_id
            assert again.json()["input_command_id"] == command_id

            other = await served.client.post(
                "/v1/sessions", json={"input": "something else"}, headers={"Idempotency-Key": "order-42"}
            )
            assert other.status_code == 409
            assert other.json()["error"]["type"] == "conflict"

            unkeyed = [await served.client.post("/v1/sessions", json={}) for _ in range(2)]
            assert [r.status_code for r in unkeyed] == [201, 201]
            assert unkeyed[0].json()["id"] != unkeyed[1].json()["id"]
            await served.session(session_id).wait_idle(timeout=30)
        # a new app (a restarted server) on the same data: the key still maps to the same session
        async with serving(scripted_rig(journal, []), idempotency_path=keys) as served:
            replay = await served.client.post(
                "/v1/sessions", json={"input": "hello"}, headers={"Idempotency-Key": "order-42"}
            )
            assert replay.status_code == 200, replay.text
            body = replay.json()
            assert body["id"] == session_id
            assert body["input_command_id"] == command_id
            assert body["live"] is False and body["status"] == "stopped"
            assert body["loops"][0]["last_reply"] == "first answer"  # the input ran once, in the first server
            conflict = await served.client.post(
                "/v1/sessions", json={"input": "changed"}, headers={"Idempotency-Key": "order-42"}
            )
            assert conflict.status_code == 409
            records = await journal.read(session_id)
            assert [r.kind for r in records].count("turn_started") == 1
    finally:
        await journal.aclose()


async def test_concurrent_requests_with_one_key_create_one_session(journal: SqliteJournal, tmp_path: Path) -> None:
    async with serving(scripted_rig(journal, []), idempotency_path=tmp_path / "keys.db") as served:
        responses = await asyncio.gather(
            *(served.client.post("/v1/sessions", json={}, headers={"Idempotency-Key": "same"}) for _ in range(5))
        )
        assert sorted(r.status_code for r in responses) == [200, 200, 200, 200, 201]
        assert len({r.json()["id"] for r in responses}) == 1
        assert len(await journal.sessions()) == 1


async def test_view_list_and_restore(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("done")])) as served:
        created = (await served.client.post("/v1/sessions", json={"input": "go"})).json()
        session_id = created["id"]
        await served.session(session_id).wait_idle(timeout=30)

        view = (await served.client.get(f"/v1/sessions/{session_id}")).json()
        assert view["status"] == "active" and view["live"] is True and view["rig"] == "test"
        assert view["turns"] == 1 and view["usage"]["calls"] == 1
        assert view["last_seq"] == 4  # session_started, turn_started, context_measured, turn_done
        assert view["loops"][0]["name"] == "main" and view["loops"][0]["busy"] is False
        assert view["gates"] == []

        listed = (await served.client.get("/v1/sessions")).json()["items"]
        assert [(s["id"], s["live"], s["status"]) for s in listed] == [(session_id, True, "active")]

        same = await served.client.post(f"/v1/sessions/{session_id}/restore")
        assert same.status_code == 200 and same.json()["restored"] is False
    # a second server over the same journal: dormant until restored, then live
    async with serving(scripted_rig(journal, [])) as served:
        listed = (await served.client.get("/v1/sessions")).json()["items"]
        assert [(s["id"], s["live"], s["status"]) for s in listed] == [(session_id, False, "stopped")]
        dormant = (await served.client.get(f"/v1/sessions/{session_id}")).json()
        assert dormant["live"] is False and dormant["turns"] == 1 and dormant["last_seq"] == 5
        restored = await served.client.post(f"/v1/sessions/{session_id}/restore")
        assert restored.status_code == 200
        assert restored.json()["restored"] is True
        assert restored.json()["status"] == "active" and restored.json()["live"] is True
        assert restored.json()["loops"][0]["last_reply"] == "done"
    assert [r.kind for r in await journal.read(session_id)][-2:] == ["session_restored", "session_stopped"]


async def test_an_input_restores_a_dormant_session_on_demand(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
    async with serving(scripted_rig(journal, [text_reply("back again")])) as served:
        accepted = await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "are you there?"})
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["loop"] == "main"
        session = served.session(session_id)
        await session.wait_idle(timeout=30)
        assert session.state.loops["main"].last_reply == "back again"


async def test_create_with_an_unknown_loop_is_refused(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        response = await served.client.post("/v1/sessions", json={"input": "x", "loop": "nope"})
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request"
        assert await journal.sessions() == []


async def test_at_the_cap_an_idle_session_is_unloaded_and_a_busy_one_means_429(journal: SqliteJournal) -> None:
    slow = text_reply("y" * 200, chunk_size=2, chunk_delay=0.02)
    async with serving(scripted_rig(journal, [text_reply("a"), slow, text_reply("b")]), max_live_sessions=1) as served:
        first = (await served.client.post("/v1/sessions", json={})).json()["id"]
        second = await served.client.post("/v1/sessions", json={})  # the idle first one makes room
        assert second.status_code == 201
        assert served.registry.live(first) is None
        assert (await journal.read(first))[-1].kind == "session_stopped"

        back = await served.client.post(f"/v1/sessions/{first}/inputs", json={"text": "hi"})  # restores it
        assert back.status_code == 202
        await served.session(first).wait_idle(timeout=30)
        assert served.registry.live(second.json()["id"]) is None

        busy = await served.client.post(f"/v1/sessions/{first}/inputs", json={"text": "keep talking"})
        assert busy.status_code == 202
        full = await served.client.post("/v1/sessions", json={})
        assert full.status_code == 429
        assert full.json()["error"]["type"] == "too_many_requests"
        assert full.headers["retry-after"]
        assert served.registry.live(first) is not None  # a busy session is never unloaded


async def test_a_faulted_session_answers_503_until_restored() -> None:
    broken = {"on": False}

    def fail_append(_session_id: str, _records: Sequence[NewRecord]) -> None:
        if broken["on"]:
            raise OSError("disk full")

    journal = MemoryJournal(fail_append=fail_append)
    async with serving(scripted_rig(journal, [text_reply("works again")])) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        frames: list[Frame] = []
        async with asyncio.timeout(30), served.client.stream("GET", f"/v1/sessions/{session_id}/events") as stream:
            broken["on"] = True
            assert (
                await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "x"})
            ).status_code == 202
            async for frame in read_frames(stream):
                frames.append(frame)
        assert frames[-1].event == "error"
        assert frames[-1].payload["error"]["type"] == "service_unavailable"
        assert "disk full" in frames[-1].payload["error"]["message"]

        view = (await served.client.get(f"/v1/sessions/{session_id}")).json()
        assert view["status"] == "faulted" and view["live"] is True
        refused = await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "again"})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "service_unavailable"

        broken["on"] = False
        restored = await served.client.post(f"/v1/sessions/{session_id}/restore")
        assert restored.json()["restored"] is True and restored.json()["status"] == "active"
        assert (await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "y"})).status_code == 202
        await served.session(session_id).wait_idle(timeout=30)
        # the faulted turn never reached the model (its first record failed), so this is the model's first answer
        assert served.session(session_id).state.loops["main"].last_reply == "works again"
