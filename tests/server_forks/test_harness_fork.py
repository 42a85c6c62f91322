"""Retry and edit-and-resend against the whole `loopd up` (in-process, real HTTP on loopback, SQLite, the demo
model): the fork's first answer is a built-in harness call started as a fork of the source answer's harness
session (just before the turn that took its input), so it answers from that harness state; the source session
and the original conversation stay as they were; a fork of a fork chains."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness import SqliteJournal
from loopd.harness.journal import replay
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from tests.support.waiting import eventually


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


@pytest.fixture
async def user(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    token = server.token_file.read_text().strip()
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15
    ) as client:
        yield client


def _text(message: dict[str, Any]) -> str:
    return "".join(str(b.get("content", "")) for b in message["content"]["blocks"] if b.get("type") == "text")


async def _messages(user: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    return list((await user.get(f"/v1/conversations/{cid}/messages", params={"limit": 1000})).json()["data"])


async def _answered(user: httpx.AsyncClient, cid: str, response_id: str) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        found = next(m for m in await _messages(user, cid) if m["id"] == response_id)
        return found if found["status"] != "streaming" else None

    answer = await eventually(ended, timeout=30, what=f"the answer {response_id}")
    assert answer["status"] == "completed", answer
    return answer


async def _ask(user: httpx.AsyncClient, cid: str, text: str) -> dict[str, Any]:
    body = {"target": {"kind": "harness", "key": "assistant"}, "text": text}
    posted = await user.post(f"/v1/conversations/{cid}/messages", json=body)
    assert posted.status_code == 201, posted.text
    await _answered(user, cid, posted.json()["response"]["id"])
    return dict(posted.json())


async def _fork(user: httpx.AsyncClient, cid: str, mid: str, **body: str) -> dict[str, Any]:
    forked = await user.post(f"/v1/conversations/{cid}/messages/{mid}/fork", json=body)
    assert forked.status_code == 201, forked.text
    await _answered(user, forked.json()["conversation_id"], forked.json()["response"]["id"])
    return dict(forked.json())


async def test_a_forks_answer_comes_from_the_forked_harness_session(
    server: RunningServer, user: httpx.AsyncClient
) -> None:
    cid = (await user.post("/v1/conversations", json={"name": "fruit"})).json()["id"]
    first = await _ask(user, cid, "apples?")
    second = await _ask(user, cid, "pears?")
    original = [(m["id"], m["status"], _text(m)) for m in await _messages(user, cid)]
    source = await server.engine.call_for_message(second["response"]["id"])
    assert source is not None and source.execution_ref is not None
    first_call = await server.engine.call_for_message(first["response"]["id"])
    assert first_call is not None and first_call.execution_ref is not None
    # The second question went on from the first answer's session (the conversation's session chain).
    assert source.params["fork"]["session"] == first_call.execution_ref

    journal = await SqliteJournal.open(server.data_dir / "harness" / "journal.db")
    try:
        source_info = await journal.session(source.execution_ref)
        assert source_info is not None

        retried = await _fork(user, cid, second["response"]["id"], mode="retry")
        fork_messages = await _messages(user, retried["conversation_id"])
        assert [_text(m) for m in fork_messages][:3] == ["apples?", _text(fork_messages[1]), "pears?"]
        assert "pears?" in _text(fork_messages[-1])  # the demo model answered the same question again
        call = await server.engine.call_for_message(retried["response"]["id"])
        assert call is not None and call.params["fork"]["session"] == source.execution_ref
        info = await journal.session(call.id)
        assert info is not None and info.parent_id == source.execution_ref
        # The fork point is the settled seq just before the source call's turn: its history is the session the
        # source went on from (the first question's turn, settled), then the fork's own turn with the question.
        shared = replay(await journal.read(call.id, 1, info.parent_seq))
        assert shared.loops and all(loop.turn is None for loop in shared.loops.values())
        assert shared.loops["main"].turns == 1
        assert any("apples?" in str(message.content) for message in shared.loops["main"].history)
        own = await journal.read(call.id, info.parent_seq + 1)
        assert any(b"pears?" in r.data for r in own) and not any(b"apples?" in r.data for r in own)
        assert (await journal.session(source.execution_ref)).last_seq == source_info.last_seq  # type: ignore[union-attr]

        # Edit and resend the first fork's question: a fork of a fork's session (the chain of parents).
        edited = await _fork(user, retried["conversation_id"], retried["input"]["id"], mode="edit", text="plums?")
        edit_messages = await _messages(user, edited["conversation_id"])
        assert [_text(m) for m in edit_messages][:3] == ["apples?", _text(fork_messages[1]), "plums?"]
        assert "plums?" in _text(edit_messages[-1])
        edit_call = await server.engine.call_for_message(edited["response"]["id"])
        assert edit_call is not None
        edit_info = await journal.session(edit_call.id)
        assert edit_info is not None and edit_info.parent_id == call.id

        # A later question in the fork goes on from the fork's own answer (its session), like any later question.
        later = await _ask(user, retried["conversation_id"], "and cherries?")
        later_call = await server.engine.call_for_message(later["response"]["id"])
        assert later_call is not None and later_call.params["fork"]["session"] == call.id
        assert later_call.params.get("history", []) == []  # nothing was said since that answer
    finally:
        await journal.aclose()
    assert [(m["id"], m["status"], _text(m)) for m in await _messages(user, cid)] == original


async def test_a_later_question_goes_on_in_the_session_that_holds_the_earlier_tool_results(
    server: RunningServer, user: httpx.AsyncClient
) -> None:
    """The conversation's second question is answered by a fork at the end of the first answer's session: the
    harness still holds the first turn's tool call and its result (which the conversation's messages never
    showed it as such), and the second session stores only its own turn."""
    from loopd.harness.journal import restore_state

    cid = (await user.post("/v1/conversations", json={"name": "files"})).json()["id"]
    body = {"target": {"kind": "harness", "key": "assistant"}, "text": "list files"}
    first = (await user.post(f"/v1/conversations/{cid}/messages", json=body)).json()

    async def gate() -> dict[str, Any] | None:  # listing the workspace asks first
        found = next(m for m in await _messages(user, cid) if m["id"] == first["response"]["id"])
        blocks = found["content"]["blocks"]
        return next((b for b in blocks if str(b.get("id", "")).startswith("gate/") and b["status"] == "pending"), None)

    pending = await eventually(gate, timeout=30, what="the gate of the first answer")
    gate_id = str(pending["id"]).removeprefix("gate/")
    approved = await user.post(f"/v1/harness/calls/{pending['call_id']}/gates/{gate_id}", json={"answer": "approve"})
    assert approved.status_code < 300, approved.text
    await _answered(user, cid, first["response"]["id"])
    second = await _ask(user, cid, "thanks")
    first_call = await server.engine.call_for_message(first["response"]["id"])
    second_call = await server.engine.call_for_message(second["response"]["id"])
    assert first_call is not None and second_call is not None and first_call.execution_ref is not None
    journal = await SqliteJournal.open(server.data_dir / "harness" / "journal.db")
    try:
        info = await journal.session(second_call.id)
        assert info is not None and info.parent_id == first_call.execution_ref
        assert info.parent_seq == (await journal.session(first_call.id)).last_seq  # type: ignore[union-attr]
        history = (await restore_state(journal, second_call.id)).state.loops["main"].history
        tools = [message for message in history if message.role == "tool"]
        assert tools and tools[0].name == "list_dir"  # the first turn's tool result, still in the session
        assert [m.content for m in history if m.role == "user"][-1] == "thanks"  # nothing said since: no preamble
        own = await journal.read(second_call.id, info.parent_seq + 1)
        assert not any(b"list_dir" in record.data for record in own)
    finally:
        await journal.aclose()
