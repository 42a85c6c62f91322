"""Task listing per responder; harness calls whose output is a harness message in the work conversation."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.server_http.support import ask, error_of, new_conversation

from .conftest import Api


def _call(task: str, **overrides: Any) -> dict[str, Any]:
    return {
        "owner_uid": f"uid-{task}",
        "effect_key": "work/0",
        "target": "parked",
        "text": "look into it",
        "task_id": task,
        "output": "work",
        "timeout": 600,
        **overrides,
    }


async def test_a_responder_lists_its_open_tasks_and_nobody_else_may(api: Api) -> None:
    user = api.user()
    assert (await api.operator("other").put("/v1/operators/other", json={})).status_code == 200
    cid = await new_conversation(user)
    mine = [await ask(user, cid, f"q{i}") for i in range(3)]
    theirs = await ask(user, cid, "for other", target="operator:other")
    echo = api.operator("echo")
    params = {"target_kind": "operator", "target_key": "echo"}

    listed = await echo.get("/v1/tasks", params=params)
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [t["task_id"] for t in body["data"]] == sorted(a["task_id"] for a in mine)
    assert body["next_after"] is None
    first = next(t for t in body["data"] if t["task_id"] == mine[0]["task_id"])
    assert first == {
        "task_id": mine[0]["task_id"],
        "conversation_id": cid,
        "input_message_id": mine[0]["input"]["id"],
        "response_message_id": mine[0]["response"]["id"],
        "target": {"kind": "operator", "key": "echo"},
        "delivery_state": "",
        "created_at": first["created_at"],
    }
    paged = await echo.get("/v1/tasks", params={**params, "limit": 2})
    assert len(paged.json()["data"]) == 2 and paged.json()["next_after"] == paged.json()["data"][-1]["task_id"]
    rest = await echo.get("/v1/tasks", params={**params, "after": paged.json()["next_after"]})
    assert [t["task_id"] for t in paged.json()["data"] + rest.json()["data"]] == [t["task_id"] for t in body["data"]]

    # A completed Task is no longer listed.
    await echo.post(f"/v1/tasks/{mine[1]['task_id']}/complete", json={})
    after = await echo.get("/v1/tasks", params=params)
    assert mine[1]["task_id"] not in [t["task_id"] for t in after.json()["data"]]
    assert len(after.json()["data"]) == 2

    # Another operator may not list echo's Tasks; it lists its own.
    refused = await api.operator("other").get("/v1/tasks", params=params)
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    own = await api.operator("other").get("/v1/tasks", params={"target_kind": "operator", "target_key": "other"})
    assert [t["task_id"] for t in own.json()["data"]] == [theirs["task_id"]]
    # The admin may list anyone's.
    admin = await user.get("/v1/tasks", params=params)
    assert admin.status_code == 200 and len(admin.json()["data"]) == 2
    bad = await echo.get("/v1/tasks", params={"target_kind": "user", "target_key": "echo"})
    assert bad.status_code == 400
    missing = await echo.get("/v1/tasks", params={"target_kind": "operator"})
    assert missing.status_code == 400


async def test_a_call_with_output_work_writes_one_harness_message_in_the_work_conversation(api: Api) -> None:
    asked = await ask(api.user(), await new_conversation(api.user()), "study")
    task_id = asked["task_id"]
    operator = api.operator()
    started = await operator.post("/v1/harness/calls", json=_call(task_id))
    assert started.status_code == 202, started.text
    call = started.json()
    replay = await operator.post("/v1/harness/calls", json=_call(task_id))
    assert replay.status_code == 202
    assert (replay.json()["id"], replay.json()["message_id"]) == (call["id"], call["message_id"])
    changed = await operator.post("/v1/harness/calls", json=_call(task_id, text="something else"))
    assert changed.status_code == 409 and error_of(changed) == "conflict"

    found = (await api.user().get("/v1/conversations", params={"task_id": task_id})).json()["data"]
    assert [c["id"] for c in found] == [call["conversation_id"]]
    assert call["conversation_id"] != asked["conversation_id"]
    messages = (await api.user().get(f"/v1/conversations/{call['conversation_id']}/messages")).json()["data"]
    assert [(m["id"], m["kind"], m["key"], m["purpose"], m["task_id"]) for m in messages] == [
        (call["message_id"], "harness", "parked", "output", task_id)
    ]
    # A second call shares the work conversation; the operator's own outputs go there too.
    second = await operator.post("/v1/harness/calls", json=_call(task_id, effect_key="work/1"))
    assert second.json()["conversation_id"] == call["conversation_id"]
    assert second.json()["message_id"] != call["message_id"]
    spoken = await operator.post(f"/v1/tasks/{task_id}/outputs", json={"key": "note", "text": "planning"})
    assert spoken.json()["message"]["conversation_id"] == call["conversation_id"]

    # The responder sees its call; another operator does not.
    assert (await operator.get(f"/v1/harness/calls/{call['id']}")).status_code == 200
    hidden = await api.operator("someone-else").get(f"/v1/harness/calls/{call['id']}")
    assert hidden.status_code == 404


async def test_output_work_needs_a_task_and_no_destination(api: Api) -> None:
    asked = await ask(api.user(), await new_conversation(api.user()), "study")
    task_id = asked["task_id"]
    operator = api.operator()
    for body in (
        _call(task_id, task_id=None),
        _call(task_id, conversation_id=asked["conversation_id"]),
        _call(task_id, message_id=asked["response"]["id"]),
        _call(task_id, output="main"),
    ):
        body = {k: v for k, v in body.items() if v is not None}
        response = await operator.post("/v1/harness/calls", json=body)
        assert response.status_code in (400, 403), (body, response.text)
    refused = await api.operator("someone-else").post("/v1/harness/calls", json=_call(task_id))
    assert refused.status_code == 403
    async with api.rig.db.transaction(read_only=True) as tx:
        assert await tx.conversations.find_work(task_id) is None  # nothing was created for the refused ones
    # A call started with an explicit destination is not the same call as one with output "work".
    explicit = _call(task_id, effect_key="x", output=None, message_id=asked["response"]["id"])
    assert (await operator.post("/v1/harness/calls", json=explicit)).status_code == 202
    as_work = {k: v for k, v in explicit.items() if k != "message_id"} | {"output": "work"}
    assert (await operator.post("/v1/harness/calls", json=as_work)).status_code == 409
    assert (await operator.post("/v1/harness/calls", json=_call(task_id))).status_code == 202  # creates the work one
    assert (await operator.post("/v1/harness/calls", json=as_work)).status_code == 409  # still a different call


async def test_after_completion_a_new_work_call_is_refused_and_a_replay_is_not(api: Api) -> None:
    asked = await ask(api.user(), await new_conversation(api.user()), "study")
    task_id = asked["task_id"]
    operator = api.operator()
    call = (await operator.post("/v1/harness/calls", json=_call(task_id))).json()
    await operator.post(f"/v1/harness/calls/{call['id']}/cancel")
    done = await operator.post(f"/v1/tasks/{task_id}/complete", json={"error": {"code": "stop", "message": "x"}})
    assert done.status_code == 200, done.text
    late = await operator.post("/v1/harness/calls", json=_call(task_id, effect_key="work/9"))
    assert late.status_code == 409 and error_of(late) == "conflict", late.text
    replay = await operator.post("/v1/harness/calls", json=_call(task_id))
    assert replay.status_code == 202 and replay.json()["id"] == call["id"]
    async with api.rig.db.transaction(read_only=True) as tx:
        harness = [m for m in await tx.messages.list_task(task_id) if m.kind == "harness"]
    assert [m.id for m in harness] == [call["message_id"]]


async def test_registration_is_renewed_by_registering_again_and_only_for_itself(api: Api) -> None:
    router = api.operator("router")
    first = await router.put("/v1/operators/router", json={"lease_seconds": 30})
    assert first.status_code == 200, first.text
    renewed = await router.put("/v1/operators/router", json={"lease_seconds": 30})
    assert renewed.status_code == 200
    assert renewed.json()["expires_at"] >= first.json()["expires_at"]
    refused = await api.operator("someone-else").put("/v1/operators/router", json={})
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    actors = (await api.user().get("/v1/actors")).json()["data"]
    assert ("operator", "router") in {(a["kind"], a["key"]) for a in actors}


async def test_concurrent_duplicate_work_calls_are_one_call_with_one_message(api: Api) -> None:
    asked = await ask(api.user(), await new_conversation(api.user()), "study")
    task_id = asked["task_id"]
    operator = api.operator()
    answers = await asyncio.gather(*(operator.post("/v1/harness/calls", json=_call(task_id)) for _ in range(6)))
    # A first start reserves a slot before it finds its twin, so racing duplicates may be told 429 (retryable).
    assert {a.status_code for a in answers} <= {202, 429} and 202 in {a.status_code for a in answers}
    started = {(a.json()["id"], a.json()["message_id"]) for a in answers if a.status_code == 202}
    replay = await operator.post("/v1/harness/calls", json=_call(task_id))
    assert replay.status_code == 202
    assert started == {(replay.json()["id"], replay.json()["message_id"])}
    async with api.rig.db.transaction(read_only=True) as tx:
        harness = [m for m in await tx.messages.list_task(task_id) if m.kind == "harness"]
        work = await tx.conversations.find_work(task_id)
    assert len(harness) == 1 and work is not None and harness[0].conversation_id == work.id


async def test_a_work_output_names_its_call_and_ends_with_it(api: Api) -> None:
    """The harness message a call opens in the work conversation carries the call's effect key as its title and ends
    when the call ends (completed / cancelled), not only when the Task completes."""
    asked = await ask(api.user(), await new_conversation(api.user()), "study")
    task_id = asked["task_id"]
    operator = api.operator()
    first = (await operator.post("/v1/harness/calls", json=_call(task_id))).json()
    second = (await operator.post("/v1/harness/calls", json=_call(task_id, effect_key="work/1"))).json()

    async def message(call: dict[str, Any]) -> dict[str, Any]:
        found = await api.user().get(f"/v1/conversations/{call['conversation_id']}/messages")
        return next(m for m in found.json()["data"] if m["id"] == call["message_id"])

    opened = await message(first)
    assert opened["status"] == "streaming"
    assert opened["content"]["meta"] == {"title": "work/0", "effect_key": "work/0"}

    async def phase_of(call: dict[str, Any], phase: str) -> bool:
        return bool((await operator.get(f"/v1/harness/calls/{call['id']}")).json()["phase"] == phase)

    await api.until(lambda: phase_of(first, "running"))
    api.adapter.last_run(first["id"]).release()
    await api.until(lambda: phase_of(first, "succeeded"))
    done = await message(first)
    assert done["status"] == "completed" and done["content"]["meta"]["title"] == "work/0"

    cancelled = await operator.post(f"/v1/harness/calls/{second['id']}/cancel")
    assert cancelled.status_code == 202
    await api.until(lambda: phase_of(second, "cancelled"))
    assert (await message(second))["status"] == "cancelled"


async def test_a_responder_finds_its_calls_by_owner_and_key_and_nobody_else_does(api: Api) -> None:
    user = api.user()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    operator = api.operator()
    first = (await operator.post("/v1/harness/calls", json=_call(task_id))).json()
    second = (await operator.post("/v1/harness/calls", json=_call(task_id, effect_key="work/1"))).json()
    owner = f"uid-{task_id}"

    found = await operator.get("/v1/harness/calls", params={"owner_uid": owner, "effect_key": "work/0"})
    assert found.status_code == 200, found.text
    assert [c["id"] for c in found.json()["data"]] == [first["id"]]
    listed = await operator.get("/v1/harness/calls", params={"owner_uid": owner})
    assert [c["id"] for c in listed.json()["data"]] == [first["id"], second["id"]]
    none = await operator.get("/v1/harness/calls", params={"owner_uid": owner, "effect_key": "work/9"})
    assert none.status_code == 200 and none.json()["data"] == []
    asker = await user.get("/v1/harness/calls", params={"owner_uid": owner})  # the Task's asker sees them too
    assert [c["id"] for c in asker.json()["data"]] == [first["id"], second["id"]]
    stranger = await api.operator("someone-else").get("/v1/harness/calls", params={"owner_uid": owner})
    assert stranger.status_code == 200 and stranger.json()["data"] == []
    for params in ({}, {"owner_uid": ""}, {"owner_uid": owner, "effect_key": ""}):
        bad = await operator.get("/v1/harness/calls", params=params)
        assert bad.status_code == 400 and error_of(bad) == "invalid_request", params
