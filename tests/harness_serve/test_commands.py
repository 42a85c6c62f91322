"""Commands over HTTP: answering a gate opened by write_file, interrupting, cancelling a queued input, paging."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from loopd.harness import Reply, SqliteJournal
from loopd.harness.gate import MemoryRuleStore
from loopd.harness.models import ModelRequest
from loopd.harness.tools import Workspace, default_tools

from .conftest import Served, scripted_rig, serving, text_reply
from .sse import read_frames


def writing_model(request: ModelRequest) -> Reply:
    """Asks to write hello.txt, then reports the tool's outcome."""
    last = request.messages[-1]
    if last.role == "tool":
        return Reply(text=f"tool said: {last.content}")
    return Reply(text="writing the file", tool_calls=[("write_file", {"path": "hello.txt", "content": "hi there"})])


async def wait_for_event(served: Served, session_id: str, kind: str, *, from_seq: int = 1) -> dict[str, Any]:
    path = f"/v1/sessions/{session_id}/events"
    async with asyncio.timeout(30), served.client.stream("GET", path, params={"from_seq": from_seq}) as response:
        async for frame in read_frames(response):
            if frame.event == kind:
                assert frame.data is not None
                return frame.data
    raise AssertionError(f"the stream ended before {kind}")


async def gate_session(served: Served) -> tuple[str, str]:
    created = (await served.client.post("/v1/sessions", json={"input": "write hello.txt"})).json()
    opened = await wait_for_event(served, created["id"], "gate_opened")
    return created["id"], opened["event"]["gate_id"]


async def test_a_gate_opened_by_write_file_is_approved_through_the_api(journal: SqliteJournal, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    rig = scripted_rig(journal, writing_model, tools=default_tools(Workspace(workspace)), workspace=workspace)
    async with serving(rig) as served:
        session_id, gate_id = await gate_session(served)
        assert "/" in gate_id  # gate ids contain slashes; the route takes them as they are

        view = (await served.client.get(f"/v1/sessions/{session_id}")).json()
        assert [g["gate_id"] for g in view["gates"]] == [gate_id]
        assert view["gates"][0]["loop"] == "main" and view["gates"][0]["call_ids"]
        assert not (workspace / "hello.txt").exists()

        answered = await served.client.post(f"/v1/sessions/{session_id}/gates/{gate_id}", json={"answer": "approve"})
        assert answered.status_code == 200, answered.text
        assert answered.json() == {
            "gate_id": gate_id,
            "status": "resolved",
            "answer": "approve",
            "granted": True,
            "reason": "approve",
        }
        done = await wait_for_event(served, session_id, "turn_done")
        assert (workspace / "hello.txt").read_text() == "hi there"
        assert done["event"]["text"].startswith("tool said:")

        again = await served.client.post(f"/v1/sessions/{session_id}/gates/{gate_id}", json={"answer": "deny"})
        assert again.status_code == 409
        assert again.json()["error"]["type"] == "conflict"
        unknown = await served.client.post(f"/v1/sessions/{session_id}/gates/main/9/9", json={"answer": "deny"})
        assert unknown.status_code == 404


async def test_deny_and_always(journal: SqliteJournal, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    rules = MemoryRuleStore()
    rig = scripted_rig(
        journal, writing_model, tools=default_tools(Workspace(workspace)), workspace=workspace, rules=rules
    )
    async with serving(rig) as served:
        session_id, gate_id = await gate_session(served)
        denied = await served.client.post(f"/v1/sessions/{session_id}/gates/{gate_id}", json={"answer": "deny"})
        assert denied.json()["answer"] == "deny" and denied.json()["granted"] is False
        done = await wait_for_event(served, session_id, "turn_done")
        assert "denied" in done["event"]["text"] or "permission" in done["event"]["text"]
        assert not (workspace / "hello.txt").exists()

        session_id, gate_id = await gate_session(served)
        always = await served.client.post(f"/v1/sessions/{session_id}/gates/{gate_id}", json={"answer": "always"})
        assert always.json()["answer"] == "approve_always" and always.json()["granted"] is True
        await wait_for_event(served, session_id, "turn_done")
        assert (workspace / "hello.txt").exists()
        assert await rules.load()  # the grant was stored before it was used


async def test_interrupt_stops_the_running_turn(journal: SqliteJournal) -> None:
    slow = text_reply("a long answer that streams slowly " * 40, chunk_size=2, chunk_delay=0.02)  # 13 s unless stopped
    async with serving(scripted_rig(journal, [slow])) as served:
        session_id = (await served.client.post("/v1/sessions", json={"input": "talk"})).json()["id"]
        await wait_for_event(served, session_id, "token_delta")
        stopped = await served.client.post(f"/v1/sessions/{session_id}/interrupt", json={"reason": "enough"})
        assert stopped.status_code == 200
        assert stopped.json() == {"session_id": session_id, "interrupted": True}
        interrupted = await wait_for_event(served, session_id, "turn_interrupted")
        assert interrupted["event"]["reason"] == "enough"
        idle = await served.client.post(f"/v1/sessions/{session_id}/interrupt")
        assert idle.json()["interrupted"] is False
        bad_loop = await served.client.post(f"/v1/sessions/{session_id}/interrupt", json={"loop": "other"})
        assert bad_loop.status_code == 400


async def test_cancel_a_queued_input(journal: SqliteJournal) -> None:
    slow = text_reply("x" * 400, chunk_size=2, chunk_delay=0.02)  # 4 s: the second input is queued behind it
    async with serving(scripted_rig(journal, [slow, text_reply("second")])) as served:
        created = (await served.client.post("/v1/sessions", json={"input": "first"})).json()
        session_id, running = created["id"], created["input_command_id"]
        await wait_for_event(served, session_id, "turn_started")
        queued = (await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "second"})).json()
        base = f"/v1/sessions/{session_id}/inputs"

        cancelled = await served.client.delete(f"{base}/{queued['command_id']}")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json() == {"command_id": queued["command_id"], "status": "cancelled"}
        assert (await served.client.delete(f"{base}/{queued['command_id']}")).status_code == 200  # idempotent

        started = await served.client.delete(f"{base}/{running}")
        assert started.status_code == 409
        assert started.json()["error"]["type"] == "conflict"
        unknown = await served.client.delete(f"{base}/no-such-input")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["type"] == "not_found"

        session = served.session(session_id)
        await session.wait_idle(timeout=30)
        assert session.state.loops["main"].turns == 1  # the cancelled input never ran
        kinds = [r.kind for r in await journal.read(session_id)]
        assert kinds.count("input_cancelled") == 1 and kinds.count("turn_started") == 1


async def test_journal_pages(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("one"), text_reply("two")])) as served:
        session_id = (await served.client.post("/v1/sessions", json={"input": "a"})).json()["id"]
        session = served.session(session_id)
        await session.wait_idle(timeout=30)
        await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": "b"})
        await session.wait_idle(timeout=30)

        seqs: list[int] = []
        kinds: list[str] = []
        cursor, pages = 1, 0
        while True:
            page = (await served.client.get(f"/v1/sessions/{session_id}/journal?from_seq={cursor}&limit=2")).json()
            pages += 1
            seqs += [item["seq"] for item in page["items"]]
            kinds += [item["event"]["kind"] for item in page["items"]]
            assert all(item["kind"] == item["event"]["kind"] for item in page["items"])
            assert page["last_seq"] == 7
            cursor = page["next_from_seq"]
            if not page["has_more"]:
                break
        assert seqs == [1, 2, 3, 4, 5, 6, 7] and pages == 4
        turn = ["turn_started", "context_measured", "turn_done"]
        assert kinds == ["session_started", *turn, *turn]
        tail = (await served.client.get(f"/v1/sessions/{session_id}/journal?from_seq=8")).json()
        assert tail["items"] == [] and tail["next_from_seq"] == 8 and tail["has_more"] is False
