"""The ten Human Ask / Confirm acceptance cases (compforge-facts §9A), one test per case, named after it."""

from __future__ import annotations

import asyncio

from loopd.agentue import AskBlock, ConfirmBlock, HumanReplyBlock, typed_block
from loopd.server.chat import TaskUnavailable
from tests.server_http.support import (
    ORIGIN,
    CommitFailingDatabase,
    Rig,
    build_rig,
    error_of,
    new_conversation,
    task_object,
)
from tests.server_human.helpers import (
    BOB,
    ask_body,
    asked,
    confirm_body,
    conversation_messages,
    question,
    reply,
    revision,
    state,
)


async def test_case_01_timeout_is_mandatory_finite_and_bounded_no_answer_times_out_ignoring_dismisses(
    rig: Rig,
) -> None:
    a = await asked(rig)
    url = f"/v1/tasks/{a.task_id}/human"
    for bad in (None, 0, -1, 3601, "soon"):
        body = (
            ask_body(timeout_seconds=bad)
            if bad is not None
            else {k: v for k, v in ask_body().items() if k != "timeout_seconds"}
        )
        response = await a.operator.post(url, json=body)
        assert response.status_code == 400, bad
        assert error_of(response) == "invalid_request"
    for unbounded in (b"Infinity", b"1e999", b"NaN"):
        raw = b'{"effect_key":"x","type":"confirm","title":"t","prompt":"p","timeout_seconds":' + unbounded + b"}"
        response = await a.operator.post(url, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, unbounded
    assert await revision(rig, a.task_id) == 1
    # No answer → timeout, enforced by the server at the deadline; the Task is woken.
    waited = await question(a, ask_body("wait", timeout_seconds=30))
    ignored = await question(a, confirm_body("ignore", timeout_seconds=300))
    await rig.clock.advance(29)
    assert await rig.human.sweep_deadlines() == 0
    await rig.clock.advance(1)
    assert await rig.human.sweep_deadlines() == 1
    timed_out = await state(a, waited["message_id"])
    assert timed_out["status"] == "timeout" and timed_out["value"] is None
    assert timed_out["message"]["status"] == "expired"
    assert await revision(rig, a.task_id) == 2
    # Ignoring → dismissed (the user says so); the Task is woken again.
    dismissed = await reply(a, ignored["message_id"], "dismissed")
    assert dismissed.status_code == 200 and dismissed.json()["status"] == "dismissed"
    assert await revision(rig, a.task_id) == 3
    # Both allow a fallback: the responder answers without the human and completes normally.
    events = [{"op": "set", "block": {"id": "a", "type": "text", "content": "used the default"}}]
    assert (await a.operator.post(f"/v1/tasks/{a.task_id}/events", json={"events": events})).status_code == 200
    done = await a.operator.post(f"/v1/tasks/{a.task_id}/complete", json={})
    assert done.status_code == 200 and done.json()["response"]["status"] == "completed"


async def test_case_02_a_repeated_call_returns_the_original_question_and_state_disconnect_is_not_dismissal(
    rig: Rig,
) -> None:
    a = await asked(rig)
    first = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=ask_body())
    assert first.status_code == 201 and first.json()["created"] is True
    original = first.json()
    await rig.clock.advance(10)
    again = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=ask_body())
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["message_id"] == original["message_id"]
    assert again.json()["due_at"] == original["due_at"]  # the deadline was fixed when first stored
    changed = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=ask_body(prompt="Which cache?"))
    assert changed.status_code == 409 and error_of(changed) == "conflict"
    # A browser that opens the stream and goes away has not dismissed anything.
    from tests.server_http.support import frames_of, real_client, served

    async with served(rig) as url:
        browser = real_client(rig, url, token=False, cookie=a.user.cookies["loopd-human"])
        async with (
            asyncio.timeout(10),
            browser.stream("GET", f"/v1/conversations/{a.conversation_id}/stream?after=0") as response,
        ):
            async for frame in frames_of(response):
                if frame.data and frame.data["message_id"] == original["message_id"]:
                    break
    assert (await state(a, original["message_id"]))["status"] == "pending"
    # A timeout creates no user message; the repeat then returns the final state.
    users_before = [m for m in await conversation_messages(a) if m["kind"] == "user"]
    await rig.clock.advance(60)
    assert await rig.human.sweep_deadlines() == 1
    assert [m for m in await conversation_messages(a) if m["kind"] == "user"] == users_before
    final = await question(a, ask_body())
    assert final["status"] == "timeout" and final["message_id"] == original["message_id"]
    assert final["due_at"] == original["due_at"]


async def test_case_03_parallel_ask_and_confirm_close_independently_and_a_timeout_blocks_nothing(rig: Rig) -> None:
    a = await asked(rig)
    q_ask = await question(a, ask_body("pick", timeout_seconds=100))
    q_confirm = await question(a, confirm_body("go", timeout_seconds=100))
    q_short = await question(a, confirm_body("short", timeout_seconds=10))
    input_before = (await a.operator.get(f"/v1/tasks/{a.task_id}")).json()
    # Answer in reverse order of asking.
    assert (await reply(a, q_confirm["message_id"], "success", "accepted")).status_code == 200
    assert (await state(a, q_ask["message_id"]))["status"] == "pending"
    await rig.clock.advance(11)
    assert await rig.human.sweep_deadlines() == 1
    assert (await state(a, q_short["message_id"]))["status"] == "timeout"
    assert (await state(a, q_ask["message_id"]))["status"] == "pending"  # the timeout blocked nothing
    assert (await reply(a, q_ask["message_id"], "success", "pg")).status_code == 200
    states = {
        m: (await state(a, m))["status"] for m in (q_ask["message_id"], q_confirm["message_id"], q_short["message_id"])
    }
    assert states == {
        q_ask["message_id"]: "success",
        q_confirm["message_id"]: "success",
        q_short["message_id"]: "timeout",
    }
    after = (await a.operator.get(f"/v1/tasks/{a.task_id}")).json()
    assert after["input"] == input_before["input"] and after["response"] == input_before["response"]  # untouched


async def test_case_04_a_reply_binds_only_through_reply_to_message_id(rig: Rig) -> None:
    a = await asked(rig)
    first = await question(a, ask_body("one"))
    second = await question(a, ask_body("two"))
    assert (await reply(a, second["message_id"], "success", "sqlite")).status_code == 200
    assert (await state(a, first["message_id"]))["status"] == "pending"
    assert (await state(a, second["message_id"]))["value"] == "sqlite"
    missing = await reply(a, None, "success", "pg")  # no reference: never inferred from the position
    assert missing.status_code == 400 and error_of(missing) == "invalid_request"
    for wrong in (a.input["id"], a.response["id"], "0190-not-a-message"):
        response = await reply(a, wrong, "success", "pg")
        assert response.status_code == 404, wrong
    assert (await state(a, first["message_id"]))["status"] == "pending"
    replies = [m for m in await conversation_messages(a) if m["purpose"] == "human_reply"]
    assert len(replies) == 1 and replies[0]["reply_to_message_id"] == second["message_id"]
    assert replies[0]["content"]["blocks"][0]["reply_to_message_id"] == second["message_id"]


async def test_case_05_the_three_ask_modes_validate_and_illegal_choices_are_rejected(rig: Rig) -> None:
    a = await asked(rig)
    closed = await question(a, ask_body("closed"))
    mixed = await question(a, ask_body("mixed", allow_other=True))
    free = await question(a, ask_body("free", choices=None, allow_other=True))
    assert free["choices"] == [] and free["allow_other"] is True
    refused = await reply(a, closed["message_id"], "success", "mysql")
    assert refused.status_code == 400 and error_of(refused) == "invalid_request"
    assert (await reply(a, closed["message_id"], "success", "pg")).status_code == 200
    assert (await reply(a, mixed["message_id"], "success", "duckdb")).status_code == 200
    assert (await reply(a, free["message_id"], "success", "anything at all")).status_code == 200
    illegal = [
        ask_body("e1", choices=[]),
        ask_body("e2", choices=[{"value": "x", "label": "X"}, {"value": "x", "label": "Again"}]),
        ask_body("e3", choices=[{"value": "", "label": "Empty"}]),
        ask_body("e4", choices=[{"value": "x", "label": ""}]),
        ask_body("e5", choices=[{"value": "x"}]),
        ask_body("e6", choices=None),
        ask_body("e7", choices=None, allow_other=False),
        ask_body("e8", confirm_label="Yes"),
        confirm_body("e9", choices=[{"value": "x", "label": "X"}]),
        confirm_body("e10", allow_other=True),
        ask_body("e11", prompt=""),
        ask_body("e12", type="poll"),
    ]
    for body in illegal:
        response = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=body)
        assert response.status_code == 400, body
    assert (await rig.human.sweep_deadlines()) == 0


async def test_case_06_confirm_with_custom_labels_answers_accepted_or_declined_and_ignoring_is_dismissed(
    rig: Rig,
) -> None:
    a = await asked(rig)
    labels = {"confirm_label": "Ship it", "decline_label": "Hold"}
    yes = await question(a, confirm_body("yes", **labels))
    no = await question(a, confirm_body("no", **labels))
    ignored = await question(a, confirm_body("ignored", **labels))
    block = yes["message"]["content"]["blocks"][0]
    assert (block["confirm_label"], block["decline_label"]) == ("Ship it", "Hold")
    label_as_value = await reply(a, yes["message_id"], "success", "Ship it")
    assert label_as_value.status_code == 400
    accepted = await reply(a, yes["message_id"], "success", "accepted")
    assert (accepted.json()["status"], accepted.json()["value"]) == ("success", "accepted")
    declined = await reply(a, no["message_id"], "success", "declined")
    assert (declined.json()["status"], declined.json()["value"]) == ("success", "declined")  # declining is an answer
    dismissed = await reply(a, ignored["message_id"], "dismissed")
    assert (dismissed.json()["status"], dismissed.json()["value"]) == ("dismissed", None)  # not a decline


async def test_case_07_free_text_is_not_limited_to_choices_and_dismiss_or_timeout_is_never_a_choice(
    rig: Rig,
) -> None:
    a = await asked(rig)
    other = await question(a, ask_body("other", allow_other=True))
    text = "Neither — use the existing Redis"
    answered = await reply(a, other["message_id"], "success", text)
    assert answered.json()["value"] == text
    assert answered.json()["message"]["content"]["blocks"][0]["value"] == text
    dismissed_q = await question(a, ask_body("dismiss"))
    timeout_q = await question(a, confirm_body("approve?", timeout_seconds=5))
    carrying = await reply(a, dismissed_q["message_id"], "dismissed", "pg")
    assert carrying.status_code == 400  # a dismissal cannot smuggle a choice
    await reply(a, dismissed_q["message_id"], "dismissed")
    await rig.clock.advance(5)
    await rig.human.sweep_deadlines()
    for message_id in (dismissed_q["message_id"], timeout_q["message_id"]):
        final = await state(a, message_id)
        assert final["value"] is None
        block = final["message"]["content"]["blocks"][0]
        assert "value" not in block and block["status"] in ("dismissed", "timeout")
    assert (await state(a, timeout_q["message_id"]))["status"] == "timeout"  # not "accepted"


async def test_case_08_the_same_block_id_in_different_messages_updates_independently_and_renders(rig: Rig) -> None:
    a = await asked(rig)
    q_ask = await question(a, ask_body("a"))
    q_confirm = await question(a, confirm_body("c", timeout_seconds=5))
    q_third = await question(a, ask_body("t", choices=None, allow_other=True))
    ids = {q["message"]["content"]["blocks"][0]["id"] for q in (q_ask, q_confirm, q_third)}
    assert ids == {"request"}  # one block id, three messages
    before_third = await state(a, q_third["message_id"])
    await reply(a, q_ask["message_id"], "success", "pg")
    await rig.clock.advance(5)
    await rig.human.sweep_deadlines()
    third = await state(a, q_third["message_id"])
    assert third["message"]["content"] == before_third["message"]["content"]
    assert third["message"]["revision"] == before_third["message"]["revision"]
    ask_view = typed_block((await state(a, q_ask["message_id"]))["message"]["content"]["blocks"][0])
    confirm_view = typed_block((await state(a, q_confirm["message_id"]))["message"]["content"]["blocks"][0])
    pending_view = typed_block(third["message"]["content"]["blocks"][0])
    assert isinstance(ask_view, AskBlock) and ask_view.status == "success" and ask_view.value == "pg"
    assert isinstance(confirm_view, ConfirmBlock) and confirm_view.status == "timeout"
    assert isinstance(pending_view, AskBlock) and pending_view.status == "pending"
    reply_message = next(m for m in await conversation_messages(a) if m["purpose"] == "human_reply")
    reply_view = typed_block(reply_message["content"]["blocks"][0])
    assert isinstance(reply_view, HumanReplyBlock) and reply_view.outcome == "success"
    for message_id in (q_ask["message_id"], q_confirm["message_id"]):
        message = (await state(a, message_id))["message"]
        assert "error" not in message["content"]["meta"]  # normal outcomes are not errors
        assert message["status"] in ("completed", "expired")


async def test_case_09_duplicate_contradictory_late_and_foreign_replies_yield_exactly_one_final_state(
    rig: Rig,
) -> None:
    a = await asked(rig)
    q = await question(a, ask_body("q"))
    first = await reply(a, q["message_id"], "success", "pg")
    assert first.status_code == 200 and first.json()["accepted"] is True
    duplicate = await reply(a, q["message_id"], "success", "pg")
    assert duplicate.status_code == 200 and duplicate.json()["accepted"] is False
    assert duplicate.json()["reply"]["id"] == first.json()["reply"]["id"]
    contradictory = await reply(a, q["message_id"], "success", "sqlite")
    assert contradictory.status_code == 409 and error_of(contradictory) == "conflict"
    assert (await reply(a, q["message_id"], "dismissed")).status_code == 409
    assert len([m for m in await conversation_messages(a) if m["purpose"] == "human_reply"]) == 1
    assert (await state(a, q["message_id"]))["value"] == "pg"
    # Racing contradictory replies: exactly one wins.
    race = await question(a, ask_body("race"))
    results = await asyncio.gather(
        reply(a, race["message_id"], "success", "pg"), reply(a, race["message_id"], "dismissed")
    )
    assert sorted(r.status_code for r in results) == [200, 409]
    # Late: past the deadline, before any sweep.
    late_q = await question(a, confirm_body("late", timeout_seconds=5))
    await rig.clock.advance(6)
    late = await reply(a, late_q["message_id"], "success", "accepted")
    assert late.status_code == 409
    assert (await state(a, late_q["message_id"]))["status"] == "timeout"
    # Wrong identities.
    pending = await question(a, ask_body("pending", timeout_seconds=600))
    bob = rig.client(token=False, cookie=BOB, origin=ORIGIN)
    for stranger in (bob, rig.client(), rig.operator()):
        response = await reply(a, pending["message_id"], "success", "pg", client=stranger)
        assert response.status_code == 403, stranger.headers
    # Across conversation and task boundaries.
    other_cid = await new_conversation(a.user)
    across_conversation = await a.user.post(
        f"/v1/conversations/{other_cid}/tasks/{a.task_id}/replies",
        json={"reply_to_message_id": pending["message_id"], "outcome": "dismissed"},
    )
    assert across_conversation.status_code == 404
    other_task = (
        await a.user.post(
            f"/v1/conversations/{a.conversation_id}/messages",
            json={"target": {"kind": "operator", "key": "echo"}, "text": "x"},
        )
    ).json()["task_id"]
    across_task = await a.user.post(
        f"/v1/conversations/{a.conversation_id}/tasks/{other_task}/replies",
        json={"reply_to_message_id": pending["message_id"], "outcome": "dismissed"},
    )
    assert across_task.status_code == 404
    assert (await state(a, pending["message_id"]))["status"] == "pending"


async def test_case_10_restart_projection_and_wake_failures_recover_and_a_late_reply_cannot_revive_the_task(
    rig: Rig,
) -> None:
    a = await asked(rig)
    q = await question(a, ask_body("q", timeout_seconds=600))
    other = await question(a, confirm_body("c", timeout_seconds=30))
    # Restart: new services, new app, new bus over the same database and Task API.
    restarted = build_rig(rig.db, rig.clock, resources=rig.resources)
    user = restarted.client(token=False, cookie=a.user.cookies["loopd-human"], origin=ORIGIN)
    again = (await user.get(f"/v1/human/{q['message_id']}")).json()
    assert again["status"] == "pending" and again["due_at"] == q["due_at"]
    snapshot = (await user.get(f"/v1/conversations/{a.conversation_id}/snapshot")).json()
    assert {m["id"] for m in snapshot["messages"]} >= {q["message_id"], other["message_id"], a.input["id"]}
    # Wake failure: the reply is refused (503) and nothing is stored; the retry works and wakes the Task.
    restarted.gateway.fail_bump = TaskUnavailable("resource API down")
    body = {"reply_to_message_id": q["message_id"], "outcome": "success", "value": "pg"}
    url = f"/v1/conversations/{a.conversation_id}/tasks/{a.task_id}/replies"
    failed = await user.post(url, json=body)
    assert failed.status_code == 503 and error_of(failed) == "service_unavailable"
    assert (await user.get(f"/v1/human/{q['message_id']}")).json()["status"] == "pending"
    assert not [
        m
        for m in (await user.get(f"/v1/conversations/{a.conversation_id}/messages")).json()["data"]
        if m["purpose"] == "human_reply"
    ]
    # The deadline sweeper meets the same failure: the question stays pending and is retried.
    await rig.clock.advance(31)
    assert await restarted.human.sweep_deadlines() == 0
    assert (await user.get(f"/v1/human/{other['message_id']}")).status_code == 503
    # Projection failure (the transaction cannot commit): also nothing half-done.
    restarted.gateway.fail_bump = None
    assert isinstance(rig.db, CommitFailingDatabase)
    rig.db.fail_commits = 1
    assert (await user.post(url, json=body)).status_code == 503
    assert (await user.get(f"/v1/human/{q['message_id']}")).json()["status"] == "pending"
    ok = await user.post(url, json=body)
    assert ok.status_code == 200 and ok.json()["status"] == "success"
    assert await restarted.human.sweep_deadlines() == 1
    # One wake per outcome, plus one from the attempt whose commit failed (a spurious wake is harmless; a
    # missing one would leave the responder asleep).
    assert await revision(rig, a.task_id) == 4
    # After the operator's fallback (a failure completion), a late reply cannot revive the Task.
    last = await question(a, ask_body("last", timeout_seconds=600))
    done = await a.operator.post(
        f"/v1/tasks/{a.task_id}/complete", json={"error": {"code": "no_answer", "message": "gave up"}}
    )
    assert done.status_code == 200
    ended = (await user.get(f"/v1/human/{last['message_id']}")).json()
    assert (ended["status"], ended["reason"]) == ("failure", "task_ended")
    assert ended["message"]["content"]["blocks"][0]["reason"] == "task_ended"
    bumps = len(restarted.gateway.bumped)
    late = await user.post(url, json={"reply_to_message_id": last["message_id"], "outcome": "success", "value": "pg"})
    assert late.status_code == 409
    assert await task_object(rig, a.task_id) is None and len(restarted.gateway.bumped) == bumps
    await restarted.aclose()
