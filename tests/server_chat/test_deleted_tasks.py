"""A Task deleted before it was answered (``kubectl delete task``): its answer fails with ``task_deleted`` instead
of streaming forever; answers whose Task exists, answers younger than the grace period and answers already
completing are left alone."""

from __future__ import annotations

from typing import Any

from loopd.server.chat._tasks import ORPHAN_GRACE
from tests.server_http.support import Rig, ask, new_conversation


async def _response(rig: Rig, message_id: str) -> Any:
    async with rig.db.transaction(read_only=True) as tx:
        return await tx.messages.get(message_id)


async def test_an_answer_whose_task_was_deleted_fails_and_others_are_left_alone(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "")
    orphan = await ask(user, cid, "who answers me?")
    alive = await ask(user, await new_conversation(user, ""), "still being worked on")
    await rig.gateway.inner.delete(orphan["task_id"])  # deleted by hand, behind the server's back

    assert await rig.task_api.sweep_orphans() == 0  # within the grace period: its Task may be on its way
    await rig.clock.advance(ORPHAN_GRACE + 1)
    young = await ask(user, cid, "asked just now")
    await rig.gateway.inner.delete(young["task_id"])
    assert await rig.task_api.sweep_orphans() == 1
    assert await rig.task_api.sweep_orphans() == 0  # once

    failed = await _response(rig, orphan["response"]["id"])
    assert failed.status == "failed" and failed.delivery_state == "closed"
    assert failed.completion == {
        "error": {"code": "task_deleted", "message": "the Task was deleted before it was answered"}
    }
    assert (await _response(rig, alive["response"]["id"])).status == "streaming"  # its Task exists
    assert (await _response(rig, young["response"]["id"])).status == "streaming"  # too young to judge
    page = (await user.get(f"/v1/conversations/{cid}/messages")).json()["data"]
    shown = next(m for m in page if m["id"] == orphan["response"]["id"])
    assert shown["status"] == "failed"


async def test_the_sweep_goes_round_every_open_answer_in_pages(rig: Rig) -> None:
    user = rig.client()
    asked = [await ask(user, await new_conversation(user, ""), f"question {i}") for i in range(5)]
    await rig.clock.advance(ORPHAN_GRACE + 1)
    await rig.gateway.inner.delete(asked[-1]["task_id"])  # the newest: past the first page of two
    found = [await rig.task_api.sweep_orphans(limit=2) for _ in range(3)]
    assert found == [0, 0, 1]
    assert (await _response(rig, asked[-1]["response"]["id"])).status == "failed"
