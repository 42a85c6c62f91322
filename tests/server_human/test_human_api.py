"""The Human API around the acceptance cases: completion rules, who may ask and read, visibility in the stream."""

from __future__ import annotations

from tests.server_http.support import ORIGIN, Rig, ask, build_rig, error_of, new_conversation, served
from tests.server_human.helpers import BOB, ask_body, asked, confirm_body, question, reply
from tests.support.waiting import eventually


async def test_a_normal_completion_is_refused_while_questions_are_pending(rig: Rig) -> None:
    a = await asked(rig)
    q = await question(a, ask_body())
    refused = await a.operator.post(f"/v1/tasks/{a.task_id}/complete", json={})
    assert refused.status_code == 409 and error_of(refused) == "conflict"
    assert (await a.operator.get(f"/v1/tasks/{a.task_id}")).json()["response"]["status"] == "streaming"
    await reply(a, q["message_id"], "success", "pg")
    done = await a.operator.post(f"/v1/tasks/{a.task_id}/complete", json={})
    assert done.status_code == 200


async def test_asking_needs_the_tasks_responder_a_committed_task_and_an_open_delivery(rig: Rig) -> None:
    a = await asked(rig)
    stranger = rig.client(actor="operator:router")
    assert (await stranger.post(f"/v1/tasks/{a.task_id}/human", json=ask_body())).status_code == 403
    browser = rig.client(token=False, cookie=BOB, origin=ORIGIN)
    assert (await browser.post(f"/v1/tasks/{a.task_id}/human", json=ask_body())).status_code == 403
    assert (await a.operator.post("/v1/tasks/not-yet/human", json=ask_body())).status_code == 404
    kept = await question(a, confirm_body("kept"))
    await reply(a, kept["message_id"], "success", "accepted")
    await a.operator.post(f"/v1/tasks/{a.task_id}/complete", json={})
    closed = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=ask_body("new"))
    assert closed.status_code == 409
    repeat = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=confirm_body("kept"))
    assert repeat.status_code == 200 and repeat.json()["status"] == "success"  # the original, final


async def test_who_may_read_a_question(rig: Rig) -> None:
    a = await asked(rig)
    q = await question(a, ask_body())
    assert (await a.user.get(f"/v1/human/{q['message_id']}")).status_code == 200
    assert (await a.operator.get(f"/v1/human/{q['message_id']}")).status_code == 200
    assert (await rig.client().get(f"/v1/human/{q['message_id']}")).status_code == 200  # the token user
    bob = rig.client(token=False, cookie=BOB)
    assert (await bob.get(f"/v1/human/{q['message_id']}")).status_code == 404
    assert (await rig.client(actor="operator:router").get(f"/v1/human/{q['message_id']}")).status_code == 404
    assert (await a.user.get(f"/v1/human/{a.input['id']}")).status_code == 404


async def test_the_cli_user_answers_its_own_questions(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    q = (await rig.operator().post(f"/v1/tasks/{task_id}/human", json=ask_body())).json()
    answered = await user.post(
        f"/v1/conversations/{cid}/tasks/{task_id}/replies",
        json={"reply_to_message_id": q["message_id"], "outcome": "success", "value": "sqlite"},
    )
    assert answered.status_code == 200
    assert answered.json()["reply"]["kind"] == "user" and answered.json()["reply"]["key"] == "local"


async def test_questions_and_replies_travel_in_the_conversation_stream(rig: Rig) -> None:
    a = await asked(rig)
    q = await question(a, ask_body())
    await reply(a, q["message_id"], "success", "pg")
    items = await rig.conversations.read_stream(a.conversation_id, after=0)
    request_ops = [i.event.event["op"] for i in items if i.event.message_id == q["message_id"]]
    assert request_ops == ["start", "set", "end"]
    start = next(i for i in items if i.event.message_id == q["message_id"])
    assert start.message is not None and start.message.purpose == "human_request"
    assert start.event.event["model"]["blocks"][0]["status"] == "pending"
    replies = [i for i in items if i.message is not None and i.message.purpose == "human_reply"]
    assert replies and replies[0].message is not None and replies[0].message.reply_to_message_id == q["message_id"]


async def test_the_app_runs_the_deadline_and_completion_sweepers(rig: Rig) -> None:
    from loopd.server.app import create_server_app

    a = await asked(rig)
    q = await question(a, confirm_body(timeout_seconds=5))
    await rig.clock.advance(6)
    app = create_server_app(rig.ctx, sweepers=True)
    background = build_rig(rig.db, rig.clock, resources=rig.resources)
    background.app = app

    async def outcome() -> str:  # read the row itself: a GET would time the question out on its own
        async with rig.db.transaction(read_only=True) as tx:
            return (await tx.human_requests.get(q["message_id"])).outcome

    async def decided() -> bool:
        return await outcome() != "pending"

    async with served(background):
        await eventually(decided, timeout=30, what="the sweeper to time the question out")
    assert await outcome() == "timeout"
    await background.aclose()
