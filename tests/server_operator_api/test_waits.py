"""Bounded waits: a harness call and a Human question, answered at their end, at the bound, and at shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from loopd.server.http import open_http_server
from tests.server_http.support import ask, error_of, new_conversation, real_client

from .conftest import Api

QUESTION = {
    "effect_key": "q1",
    "type": "confirm",
    "title": "Deploy?",
    "prompt": "Deploy now?",
    "timeout_seconds": 30,
}


async def _parked_call(api: Api) -> tuple[dict[str, Any], dict[str, Any]]:
    asked = await ask(api.user(), await new_conversation(api.user()), "work")
    body = {
        "owner_uid": f"uid-{asked['task_id']}",
        "effect_key": "work/0",
        "target": "parked",
        "text": "go",
        "task_id": asked["task_id"],
        "output": "work",
        "timeout": 600,
    }
    started = await api.operator().post("/v1/harness/calls", json=body)
    assert started.status_code == 202, started.text
    call = started.json()

    async def parked() -> bool:
        return call["id"] in api.adapter.runs

    await api.until(parked)
    return asked, call


async def _pending(request: asyncio.Task[httpx.Response]) -> None:
    """Give the wait a moment of real time; it must still be waiting (it has no reason to answer yet)."""
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not request.done(), request.result().text


async def test_a_call_wait_answers_when_the_call_ends(api: Api) -> None:
    _, call = await _parked_call(api)
    operator = api.operator()
    waiting = asyncio.create_task(operator.get(f"/v1/harness/calls/{call['id']}/wait", params={"timeout": 60}))
    await _pending(waiting)
    api.adapter.last_run(call["id"]).release()
    answered = await asyncio.wait_for(waiting, 10)  # virtual time stands still: only the call's end answers it
    assert answered.status_code == 200, answered.text
    assert answered.json()["id"] == call["id"] and answered.json()["phase"] == "succeeded"
    again = await operator.get(f"/v1/harness/calls/{call['id']}/wait")  # terminal: at once
    assert again.json()["phase"] == "succeeded"


async def test_a_call_wait_answers_at_its_bound_and_never_cancels(api: Api) -> None:
    _, call = await _parked_call(api)
    operator = api.operator()
    waiting = asyncio.create_task(operator.get(f"/v1/harness/calls/{call['id']}/wait", params={"timeout": 5}))
    await _pending(waiting)
    await api.clock.advance(5)
    answered = await asyncio.wait_for(waiting, 10)
    assert answered.status_code == 200 and answered.json()["phase"] not in ("succeeded", "failed", "cancelled")
    assert not answered.json()["cancel_requested"]
    for timeout in (0, -1, 61, "nan", "x"):
        bad = await operator.get(f"/v1/harness/calls/{call['id']}/wait", params={"timeout": timeout})
        assert bad.status_code == 400 and error_of(bad) == "invalid_request", timeout
    hidden = await api.operator("someone-else").get(f"/v1/harness/calls/{call['id']}/wait", params={"timeout": 1})
    assert hidden.status_code == 404


async def test_a_human_wait_answers_at_the_reply_at_the_bound_and_at_the_deadline(api: Api) -> None:
    user = api.user()
    cid = await new_conversation(user)
    asked = await ask(user, cid, "deploy?")
    task_id = asked["task_id"]
    operator = api.operator()
    q = (await operator.post(f"/v1/tasks/{task_id}/human", json=QUESTION)).json()
    url = f"/v1/human/{q['message_id']}/wait"

    bounded = asyncio.create_task(operator.get(url, params={"timeout": 2}))
    await _pending(bounded)
    await api.clock.advance(2)
    answered = await asyncio.wait_for(bounded, 10)
    assert answered.status_code == 200 and answered.json()["status"] == "pending"

    waiting = asyncio.create_task(operator.get(url, params={"timeout": 60}))
    await _pending(waiting)
    replied = await user.post(
        f"/v1/conversations/{cid}/tasks/{task_id}/replies",
        json={"reply_to_message_id": q["message_id"], "outcome": "success", "value": "accepted"},
    )
    assert replied.status_code == 200, replied.text
    answered = await asyncio.wait_for(waiting, 10)
    assert answered.status_code == 200 and answered.json()["status"] == "success"
    assert answered.json()["value"] == "accepted"

    late = (await operator.post(f"/v1/tasks/{task_id}/human", json={**QUESTION, "effect_key": "q2"})).json()
    waiting = asyncio.create_task(operator.get(f"/v1/human/{late['message_id']}/wait", params={"timeout": 60}))
    await _pending(waiting)
    await api.clock.advance(30)  # the question's own deadline comes first: it times out, and the wait says so
    answered = await asyncio.wait_for(waiting, 10)
    assert answered.status_code == 200 and answered.json()["status"] == "timeout"

    stranger = await api.operator("someone-else").get(url, params={"timeout": 1})
    assert stranger.status_code == 404
    assert (await operator.get(url, params={"timeout": 0})).status_code == 400


async def test_waits_answer_when_the_server_shuts_down(api: Api) -> None:
    _, call = await _parked_call(api)
    asked = await ask(api.user(), await new_conversation(api.user()), "deploy?")
    q = (await api.operator().post(f"/v1/tasks/{asked['task_id']}/human", json=QUESTION)).json()
    async with open_http_server(api.rig.app, graceful_timeout=30.0) as second:
        operator = real_client(api.rig, second.url, actor="operator:echo")
        waits = [
            asyncio.create_task(operator.get(f"/v1/harness/calls/{call['id']}/wait", params={"timeout": 60})),
            asyncio.create_task(operator.get(f"/v1/human/{q['message_id']}/wait", params={"timeout": 60})),
        ]
        for waiting in waits:
            await _pending(waiting)
    # Leaving the block stopped the server: the waits were answered with their current state, not dropped.
    call_state, question_state = [await asyncio.wait_for(w, 10) for w in waits]
    assert call_state.status_code == 200 and call_state.json()["phase"] == "running", call_state.text
    assert question_state.status_code == 200 and question_state.json()["status"] == "pending"


async def _start_waiting(api: Api, wait: float) -> tuple[dict[str, Any], asyncio.Task[httpx.Response]]:
    """A parked call started with ``wait``: its body and the start's request, still waiting (checked)."""
    asked = await ask(api.user(), await new_conversation(api.user()), "work")
    body = {
        "owner_uid": f"uid-{asked['task_id']}",
        "effect_key": "work/0",
        "target": "parked",
        "text": "go",
        "task_id": asked["task_id"],
        "output": "work",
        "timeout": 600,
    }
    starting = asyncio.create_task(api.operator().post("/v1/harness/calls", json={**body, "wait": wait}))

    async def parked() -> bool:
        return bool(api.adapter.runs)

    await api.until(parked)
    await _pending(starting)  # started, parked, and the start's own request still waiting for its end
    return body, starting


async def test_a_start_with_wait_answers_when_the_call_ends_and_wait_is_no_parameter(api: Api) -> None:
    body, starting = await _start_waiting(api, 60)
    operator = api.operator()
    (call_id,) = api.adapter.runs
    api.adapter.last_run(call_id).release()
    answered = await asyncio.wait_for(starting, 10)  # virtual time stands still: only the call's end answers it
    assert answered.status_code == 202, answered.text
    assert answered.json()["id"] == call_id and answered.json()["phase"] == "succeeded"
    for wait in (0, 5, 60):  # a replay with any wait is the same call (wait is not one of its parameters)
        replay = await operator.post("/v1/harness/calls", json={**body, "wait": wait})
        assert replay.status_code == 202 and replay.json()["id"] == call_id and replay.json()["phase"] == "succeeded"
    for bad_wait in (-1, 61, "nan", "x"):
        bad = await operator.post("/v1/harness/calls", json={**body, "effect_key": "work/1", "wait": bad_wait})
        assert bad.status_code == 400 and error_of(bad) == "invalid_request", bad_wait


async def test_a_start_with_wait_answers_at_its_bound_with_the_call_running(api: Api) -> None:
    _, starting = await _start_waiting(api, 5)
    await api.clock.advance(5)
    answered = await asyncio.wait_for(starting, 10)
    assert answered.status_code == 202 and answered.json()["phase"] not in ("succeeded", "failed", "cancelled")
    assert not answered.json()["cancel_requested"]
