"""Full prompts over HTTP: ``GET /v1/ledger/attempt`` resolves an attempt's stored request and reply for whoever may
read its trail (nobody else, and not through another Task's trail); ``GET /v1/ledger/tree`` names the artifacts;
``GET /v1/ledger/cost`` groups spend by conversation, target or model, for the admin only."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from loopd.server.audit import ledger_router
from loopd.server.ledger import (
    MESSAGES_TYPE,
    REPLY_TYPE,
    REQUEST_TYPE,
    TOOLS_TYPE,
    Action,
    ActionType,
    Actor,
    Attempt,
    EffectKind,
    Idempotency,
    Lane,
    LaneRecorder,
    LedgerStore,
    SqlLedgerStore,
    Turn,
    Usage,
    artifact_blob,
    completed,
    ref_payload,
    requested,
)
from tests.server_http.support import BASE, Rig, ask, error_of, new_conversation

from .test_access import actor_token, bearer

T0 = datetime.now(UTC) - timedelta(hours=1)


async def record_model_call(
    ledger: LedgerStore, *, task_id: str, call_id: str, model: str, target: str, cost: float
) -> str:
    """A lane with one model call whose attempt references a stored request (two chained segments) and reply."""
    actor = await ledger.ensure_actor(Actor(type="harness", key="builtin", framework="loopd"))
    lane = await ledger.create_lane(
        Lane(
            session_id=call_id,
            run_id=call_id,
            task_id=task_id,
            conversation_id=f"work-{call_id}",
            harness_call_id=call_id,
            attributes={"target": target},
        )
    )
    turn = await ledger.create_turn(Turn(lane_id=lane.id))
    action = await ledger.create_action(
        Action(turn.id, ActionType.MODEL_CALL, EffectKind.READ, Idempotency.INHERENT, name=model)
    )
    attempt = await ledger.create_attempt(Attempt(action.id))
    first = artifact_blob({"parent": None, "messages": [{"role": "user", "content": "hi"}]}, MESSAGES_TYPE)
    second = artifact_blob(
        {"parent": first.ref.sha256, "messages": [{"role": "assistant", "content": f"hello from {call_id}"}]},
        MESSAGES_TYPE,
    )
    tools = artifact_blob([], TOOLS_TYPE)
    manifest = artifact_blob(
        {"model": model, "system": "Be brief.", "tools": tools.ref.sha256, "messages": {"head": second.ref.sha256}},
        REQUEST_TYPE,
    )
    reply = artifact_blob({"text": "done", "tool_calls": []}, REPLY_TYPE)
    await ledger.put_artifacts(lane.id, [first, second, tools, manifest, reply])
    start = T0 + timedelta(seconds=1)
    await LaneRecorder(ledger, lane).append(
        [
            dataclasses.replace(
                requested(attempt, actor.id, payload={"request": ref_payload(manifest.ref), "model": model}),
                occurred_at=start,
            ),
            dataclasses.replace(
                completed(
                    attempt,
                    actor.id,
                    usage=Usage(100, 10, cost),
                    payload={"reply": ref_payload(reply.ref), "finish_reason": "stop", "duration_ms": 250.0},
                ),
                occurred_at=start + timedelta(milliseconds=250),
            ),
        ]
    )
    return attempt.id


def _mount(rig: Rig) -> SqlLedgerStore:
    ledger = SqlLedgerStore(rig.db)
    rig.app.include_router(ledger_router(ledger, tasks=rig.task_api, conversations=rig.conversations))
    return ledger


async def test_the_asker_reads_an_attempts_full_request_and_reply(rig: Rig) -> None:
    ledger = _mount(rig)
    user = rig.client(token=False, cookie="a1" * 32, origin=BASE)
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, target="operator:echo"))["task_id"]
    attempt_id = await record_model_call(
        ledger, task_id=task_id, call_id="call-p1", model="gpt-test", target="assistant", cost=0.5
    )

    response = await user.get("/v1/ledger/attempt", params={"attempt_id": attempt_id, "task_id": task_id})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["expired"] is False
    assert body["request"]["model"] == "gpt-test" and body["request"]["system"] == "Be brief."
    assert body["request"]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello from call-p1"},
    ]
    assert body["reply"] == {"text": "done", "tool_calls": []}
    node = body["attempt"]
    assert node["model"] == "gpt-test" and node["finish_reason"] == "stop" and node["duration_ms"] == 250.0

    tree = (await user.get("/v1/ledger/tree", params={"task_id": task_id})).json()
    [action] = tree["lanes"][0]["turns"][0]["actions"]
    [attempt] = action["attempts"]
    assert attempt["request"]["content_type"] == REQUEST_TYPE and attempt["reply"]["content_type"] == REPLY_TYPE
    assert attempt["request"]["uri"].startswith("ledger-artifact:sha256:")


async def test_nobody_else_reads_the_prompts(rig: Rig) -> None:
    ledger = _mount(rig)
    user = rig.client(token=False, cookie="b2" * 32, origin=BASE)
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, target="operator:echo"))["task_id"]
    attempt_id = await record_model_call(
        ledger, task_id=task_id, call_id="call-p2", model="gpt-test", target="assistant", cost=0.5
    )
    query = {"attempt_id": attempt_id, "task_id": task_id}

    stranger = rig.client(token=False, cookie="c3" * 32, origin=BASE)
    refused = await stranger.get("/v1/ledger/attempt", params=query)
    assert refused.status_code == 404 and error_of(refused) == "not_found"
    # The stranger's own Task does not open another Task's attempt either.
    theirs = (await ask(stranger, await new_conversation(stranger), target="operator:echo"))["task_id"]
    crossed = await stranger.get("/v1/ledger/attempt", params={"attempt_id": attempt_id, "task_id": theirs})
    assert crossed.status_code == 404 and error_of(crossed) == "not_found"
    unauthenticated = rig.client(token=False)
    assert (await unauthenticated.get("/v1/ledger/attempt", params=query)).status_code == 401
    # The responder the Task was addressed to reads it (as it reads the tree); another operator does not.
    echo = bearer(rig, await actor_token(rig, "operator:echo"))
    assert (await echo.get("/v1/ledger/attempt", params=query)).status_code == 200
    other = bearer(rig, await actor_token(rig, "operator:other"))
    assert (await other.get("/v1/ledger/attempt", params=query)).status_code in (403, 404)
    assert (await user.get("/v1/ledger/attempt", params={"attempt_id": "nope", "task_id": task_id})).status_code == 404


async def test_cost_groups_spend_for_the_admin_only(rig: Rig) -> None:
    ledger = _mount(rig)
    user = rig.client(token=False, cookie="d4" * 32, origin=BASE)
    cid = await new_conversation(user)
    task_id = (await ask(user, cid, target="operator:echo"))["task_id"]
    await record_model_call(ledger, task_id=task_id, call_id="call-c1", model="gpt-a", target="assistant", cost=0.5)
    await record_model_call(ledger, task_id=task_id, call_id="call-c2", model="gpt-b", target="assistant", cost=0.25)
    await record_model_call(ledger, task_id=task_id, call_id="call-c3", model="gpt-a", target="coder", cost=1.0)

    admin = rig.client()
    by_model = await admin.get("/v1/ledger/cost", params={"since": "7d", "by": "model"})
    assert by_model.status_code == 200, by_model.text
    rows = {row["key"]: row for row in by_model.json()["rows"]}
    assert rows["gpt-a"]["cost_usd"] == 1.5 and rows["gpt-a"]["attempts"] == 2
    assert rows["gpt-b"]["input_tokens"] == 100 and rows["gpt-b"]["output_tokens"] == 10
    assert by_model.json()["total"]["cost_usd"] == 1.75
    by_target = (await admin.get("/v1/ledger/cost", params={"by": "target"})).json()
    assert [(row["key"], row["cost_usd"]) for row in by_target["rows"]] == [("coder", 1.0), ("assistant", 0.75)]
    later = await admin.get("/v1/ledger/cost", params={"since": (datetime.now(UTC) + timedelta(days=1)).isoformat()})
    assert later.json()["rows"] == []

    refused = await user.get("/v1/ledger/cost")
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    bad = await admin.get("/v1/ledger/cost", params={"since": "last tuesday"})
    assert bad.status_code == 400 and error_of(bad) == "invalid_request"
    assert (await admin.get("/v1/ledger/cost", params={"by": "mood"})).status_code in (400, 422)
