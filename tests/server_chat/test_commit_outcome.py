"""A chat request whose COMMIT times out is resolved by reading the input back, never compensated blindly:
committed → the request succeeded and its Task stays; not committed → the Task is deleted; unknowable → 503 and
nothing is undone (the messages and their Task stay together)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd._infra.clock import VirtualClock
from loopd.server.storage import Database, DatabaseOptions
from tests.server_http.support import Rig, build_rig, error_of, new_conversation, task_object
from tests.server_storage.slow_commits import SlowCommit, slow_commits

TIMEOUT = 0.5
BODY = {"target": {"kind": "operator", "key": "echo"}, "text": "hello"}


@pytest.fixture
async def sqlite_rig(tmp_path: Path, clock: VirtualClock) -> AsyncIterator[Rig]:
    db = await Database.open(tmp_path / "loopd.db", options=DatabaseOptions(clock=clock, operation_timeout=TIMEOUT))
    rig = build_rig(db, clock)
    try:
        yield rig
    finally:
        await rig.aclose()
        await db.aclose()


async def _messages(rig: Rig, conversation_id: str) -> list[str]:
    async with rig.db.transaction(read_only=True) as tx:
        return [m.purpose for m in await tx.messages.list_conversation(conversation_id)]


async def test_a_commit_that_timed_out_but_succeeded_keeps_its_task(
    sqlite_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = sqlite_rig
    user = rig.client()
    cid = await new_conversation(user)
    # The COMMIT outlives its own timeout and the wait for it to settle (outcome unknown), then goes through.
    with slow_commits(monkeypatch, SlowCommit(release_after_timeouts=2)) as slow:
        answer = await user.post(f"/v1/conversations/{cid}/messages", json=BODY)
    assert slow.timeouts == 2
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["task_id"]
    assert rig.gateway.deleted == []  # not compensated
    assert await task_object(rig, task_id) is not None
    assert await _messages(rig, cid) == ["input", "response"]


async def test_a_commit_that_timed_out_and_failed_takes_its_task_back(
    sqlite_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = sqlite_rig
    user = rig.client()
    cid = await new_conversation(user)
    with slow_commits(monkeypatch, SlowCommit(release_after_timeouts=2, fail=True)):
        answer = await user.post(f"/v1/conversations/{cid}/messages", json=BODY)
    assert answer.status_code == 503, answer.text
    assert error_of(answer) == "service_unavailable"
    assert rig.gateway.deleted == rig.gateway.created and len(rig.gateway.created) == 1
    assert await task_object(rig, rig.gateway.created[0]) is None
    assert await _messages(rig, cid) == []


async def test_an_outcome_that_cannot_be_read_back_undoes_nothing(
    sqlite_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = sqlite_rig
    user = rig.client()
    cid = await new_conversation(user)
    with slow_commits(monkeypatch, SlowCommit()) as slow:  # still committing while the request answers
        answer = await user.post(f"/v1/conversations/{cid}/messages", json=BODY)
        assert answer.status_code == 503, answer.text
        assert error_of(answer) == "service_unavailable"
        assert "may or may not have been stored" in answer.json()["error"]["message"]
        assert rig.gateway.deleted == []
        slow.release()
    (task_id,) = rig.gateway.created
    async with rig.db.transaction() as tx:  # starts once the COMMIT has settled
        input_, response = await tx.messages.task_pair(task_id)
    assert (input_.purpose, response.purpose) == ("input", "response")
    assert await task_object(rig, task_id) is not None  # messages and Task stay together
