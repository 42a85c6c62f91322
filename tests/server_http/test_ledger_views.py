"""The web UI's ledger reads: ``GET /v1/ledger/tree`` (lanes → turns → actions → attempts, statuses, tokens, USD)
and ``GET /v1/ledger/series`` (a conversation's cost over time, its Tasks' work calls included), with the trail's
access rules: the asker reads them, nobody else does."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from loopd.server.audit import ledger_router
from loopd.server.ledger import (
    Action,
    ActionType,
    Actor,
    Attempt,
    EffectKind,
    Idempotency,
    Lane,
    LaneRecorder,
    LedgerStore,
    NewEvent,
    SqlLedgerStore,
    Turn,
    Usage,
    completed,
    failed,
    requested,
)
from tests.server_http.support import BASE, Rig, ask, error_of, new_conversation

from .test_access import actor_token, bearer

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(event: NewEvent, seconds: int) -> NewEvent:
    return dataclasses.replace(event, occurred_at=T0 + timedelta(seconds=seconds))


async def record_call(
    ledger: LedgerStore, *, task_id: str, conversation_id: str, call_id: str, start: int, tool: bool = False
) -> dict[str, str]:
    """One harness call's lane: a model action with an interrupted (estimated) attempt and a completed one; with
    ``tool`` a child tool action whose attempt is still in doubt."""
    actor = await ledger.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    lane = await ledger.create_lane(
        Lane(
            session_id=call_id, run_id="run", task_id=task_id, conversation_id=conversation_id, harness_call_id=call_id
        )
    )
    turn = await ledger.create_turn(Turn(lane_id=lane.id))
    model = await ledger.create_action(
        Action(turn.id, ActionType.MODEL_CALL, effect_kind=EffectKind.NONE, idempotency=Idempotency.INHERENT, name="m")
    )
    recorder = LaneRecorder(ledger, lane)
    cut = await ledger.create_attempt(Attempt(model.id))
    done = await ledger.create_attempt(Attempt(model.id))
    interrupted = {"code": "interrupted", "message": "cut short"}
    await recorder.append(
        [
            at(NewEvent("turn.started", turn.id, actor.id), start),
            at(requested(cut, actor.id), start),
            at(failed(cut, actor.id, error=interrupted, usage=Usage(40, 8, 0.25), usage_estimated=True), start + 1),
            at(requested(done, actor.id), start + 2),
            at(completed(done, actor.id, usage=Usage(100, 20, 0.5)), start + 3),
        ]
    )
    ids = {"lane": lane.id, "turn": turn.id, "model": model.id, "cut": cut.id, "done": done.id}
    if tool:
        child = await ledger.create_action(
            Action(
                turn.id, ActionType.TOOL_CALL, effect_kind=EffectKind.READ, name="read_file", parent_action_id=model.id
            )
        )
        doubt = await ledger.create_attempt(Attempt(child.id))
        await recorder.append([at(requested(doubt, actor.id), start + 4)])
        ids |= {"tool": child.id, "doubt": doubt.id}
    else:
        await recorder.append([at(NewEvent("turn.completed", turn.id, actor.id), start + 4)])
    return ids


async def test_the_tree_ties_attempts_to_their_actions_with_tokens_and_cost(rig: Rig) -> None:
    ledger = SqlLedgerStore(rig.db)
    rig.app.include_router(ledger_router(ledger, tasks=rig.task_api, conversations=rig.conversations))
    user = rig.client(token=False, cookie="ab" * 32, origin=BASE)
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, target="operator:echo"))["task_id"]
    ids = await record_call(ledger, task_id=task_id, conversation_id="work-1", call_id="call-1", start=0, tool=True)

    response = await user.get("/v1/ledger/tree", params={"task_id": task_id})
    assert response.status_code == 200, response.text
    tree = response.json()
    assert tree["task_id"] == task_id
    [lane] = tree["lanes"]
    assert lane["id"] == ids["lane"] and lane["harness_call_id"] == "call-1" and lane["task_id"] == task_id
    [turn] = lane["turns"]
    assert turn["id"] == ids["turn"] and turn["status"] == "running"  # started, not ended: the tool is in doubt
    model, tool = turn["actions"]
    assert (model["id"], model["type"], model["parent_action_id"]) == (ids["model"], "model_call", None)
    assert (tool["id"], tool["type"], tool["name"]) == (ids["tool"], "tool_call", "read_file")
    # No action.* events here: an action's status comes from its attempts once they have all ended (the last one's).
    assert model["status"] == "completed" and tool["status"] == "running"
    assert tool["parent_action_id"] == ids["model"]
    cut, done = model["attempts"]
    assert cut["id"] == ids["cut"] and cut["status"] == "failed" and cut["resolved"] is True
    assert cut["usage"] == {"input_tokens": 40, "output_tokens": 8, "cost_usd": 0.25} and cut["usage_estimated"]
    assert cut["error"] == {"code": "interrupted", "message": "cut short"}
    assert done["status"] == "completed" and done["usage"] == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cost_usd": 0.5,
    }
    assert done["requested_at"] < done["ended_at"] and done["error"] is None
    [doubt] = tool["attempts"]
    assert doubt["status"] == "requested" and doubt["resolved"] is False and doubt["ended_at"] is None
    assert doubt["usage"] is None
    usage = tree["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cost_usd"]) == (140, 28, 0.75)
    assert usage["usage_estimated"] is True


async def test_the_series_covers_the_conversations_tasks_oldest_first(rig: Rig) -> None:
    ledger = SqlLedgerStore(rig.db)
    rig.app.include_router(ledger_router(ledger, tasks=rig.task_api, conversations=rig.conversations))
    user = rig.client(token=False, cookie="cd" * 32, origin=BASE)
    cid = await new_conversation(user)
    first = (await ask(user, cid, target="operator:echo"))["task_id"]
    second = (await ask(user, cid, target="operator:echo"))["task_id"]
    other = await new_conversation(user)
    elsewhere = (await ask(user, other, target="operator:echo"))["task_id"]
    await record_call(ledger, task_id=second, conversation_id="work-2", call_id="call-2", start=100)
    await record_call(ledger, task_id=first, conversation_id="work-1", call_id="call-1", start=0)
    await record_call(ledger, task_id=elsewhere, conversation_id="work-3", call_id="call-3", start=50)

    response = await user.get("/v1/ledger/series", params={"conversation_id": cid})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["conversation_id"] == cid
    points = body["points"]
    assert [(p["task_id"], p["call_id"]) for p in points] == [
        (first, "call-1"),
        (first, "call-1"),
        (second, "call-2"),
        (second, "call-2"),
    ]
    assert [p["at"] for p in points] == sorted(p["at"] for p in points)
    assert [p["cost_usd"] for p in points] == [0.25, 0.5, 0.25, 0.5]
    assert [p["usage_estimated"] for p in points] == [True, False, True, False]
    assert points[1]["input_tokens"] == 100 and points[1]["output_tokens"] == 20
    empty = await user.get("/v1/ledger/series", params={"conversation_id": await new_conversation(user)})
    assert empty.json()["points"] == []


async def test_only_the_asker_reads_the_tree_and_the_series(rig: Rig) -> None:
    ledger = SqlLedgerStore(rig.db)
    rig.app.include_router(ledger_router(ledger, tasks=rig.task_api, conversations=rig.conversations))
    user = rig.client(token=False, cookie="ef" * 32, origin=BASE)
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, target="operator:echo"))["task_id"]
    await record_call(ledger, task_id=task_id, conversation_id="work-1", call_id="call-1", start=0)
    stranger = rig.client(token=False, cookie="01" * 32, origin=BASE)
    tree = await stranger.get("/v1/ledger/tree", params={"task_id": task_id})
    assert tree.status_code == 404 and error_of(tree) == "not_found"
    series = await stranger.get("/v1/ledger/series", params={"conversation_id": cid})
    assert series.status_code == 404 and error_of(series) == "not_found"
    echo = bearer(rig, await actor_token(rig, "operator:echo"))
    refused = await echo.get("/v1/ledger/series", params={"conversation_id": cid})
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    assert (await echo.get("/v1/ledger/tree", params={"task_id": task_id})).status_code == 200  # its own Task
    assert (await user.get("/v1/ledger/tree")).status_code == 400
    assert (await user.get("/v1/ledger/series")).status_code == 400
    assert len((await user.get("/v1/ledger/series", params={"conversation_id": cid})).json()["points"]) == 2
