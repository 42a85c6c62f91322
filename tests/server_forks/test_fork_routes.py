"""`POST /v1/conversations/{id}/messages/{mid}/fork`: "retry from here" and "edit and resend" make a new
conversation with the history before the chosen message and ask again there; the original stays as it was; only
the conversation's owner may fork it; bad ids, the wrong kind of message and a still-streaming answer are 4xx."""

from __future__ import annotations

from typing import Any

import httpx

from tests.server_http.support import ORIGIN, Rig, ask, error_of, new_conversation, text_events


async def _answer(rig: Rig, task_id: str, text: str) -> None:
    done = await rig.operator().post(f"/v1/tasks/{task_id}/complete", json={"events": text_events("answer", text)})
    assert done.status_code == 200, done.text


async def _texts(client: httpx.AsyncClient, conversation_id: str) -> list[tuple[str, str, str]]:
    page = (await client.get(f"/v1/conversations/{conversation_id}/snapshot")).json()["messages"]
    return [(m["purpose"], m["status"], _text(m)) for m in page]


def _text(message: dict[str, Any]) -> str:
    return "".join(str(b.get("content", "")) for b in message["content"]["blocks"] if b.get("type") == "text")


async def _two_turns(rig: Rig, user: httpx.AsyncClient) -> tuple[str, list[dict[str, Any]]]:
    cid = await new_conversation(user, "fruit")
    asked = []
    for question, answer in (("apples?", "red"), ("pears?", "green")):
        posted = await ask(user, cid, question)
        await _answer(rig, posted["task_id"], answer)
        asked.append(posted)
    return cid, asked


async def test_retry_and_edit_fork_the_conversation_and_leave_the_original(rig: Rig) -> None:
    user = rig.client()
    cid, asked = await _two_turns(rig, user)
    before = await _texts(user, cid)
    assert [t for _, _, t in before] == ["apples?", "red", "pears?", "green"]

    retry = await user.post(
        f"/v1/conversations/{cid}/messages/{asked[1]['response']['id']}/fork", json={"mode": "retry"}
    )
    assert retry.status_code == 201, retry.text
    body = retry.json()
    fork = body["conversation_id"]
    assert fork != cid and body["conversation"]["id"] == fork and body["conversation"]["name"] == "fruit"
    assert body["forked_from"] == {"conversation_id": cid, "message_id": asked[1]["response"]["id"], "mode": "retry"}
    assert _text(body["input"]) == "pears?" and body["response"]["status"] == "streaming"
    # The fork: the history before the retried answer's question, then that question asked again (a new Task).
    assert await _texts(user, fork) == [
        ("input", "completed", "apples?"),
        ("response", "completed", "red"),
        ("input", "completed", "pears?"),
        ("response", "streaming", ""),
    ]
    await _answer(rig, body["task_id"], "yellow")
    assert [t for _, _, t in await _texts(user, fork)] == ["apples?", "red", "pears?", "yellow"]

    edit = await user.post(
        f"/v1/conversations/{cid}/messages/{asked[0]['input']['id']}/fork", json={"mode": "edit", "text": "plums?"}
    )
    assert edit.status_code == 201, edit.text
    edited = edit.json()
    assert edited["forked_from"]["mode"] == "edit"
    assert await _texts(user, edited["conversation_id"]) == [
        ("input", "completed", "plums?"),
        ("response", "streaming", ""),
    ]
    task = await rig.task(edited["task_id"])
    assert task is not None and task["spec"]["target"] == {"kind": "operator", "key": "echo"}

    # A question copied into the fork (it belongs to no Task there) can be edited and resent too.
    copied = (await user.get(f"/v1/conversations/{fork}/messages")).json()["data"][0]
    again = await user.post(
        f"/v1/conversations/{fork}/messages/{copied['id']}/fork", json={"mode": "edit", "text": "figs?"}
    )
    assert again.status_code == 201, again.text
    assert [t for _, _, t in await _texts(user, again.json()["conversation_id"])] == ["figs?", ""]

    assert await _texts(user, cid) == before  # the original is untouched
    listed = {c["id"]: c for c in (await user.get("/v1/conversations")).json()["data"]}
    assert {cid, fork, edited["conversation_id"]} <= set(listed)
    # Each item says where a fork came from (the parent stays null); so does the conversation itself.
    assert listed[fork]["forked_from"] == body["forked_from"] and listed[cid]["forked_from"] is None
    assert listed[edited["conversation_id"]]["forked_from"] == edited["forked_from"]
    assert listed[again.json()["conversation_id"]]["forked_from"]["conversation_id"] == fork  # a fork of a fork
    assert (await user.get(f"/v1/conversations/{fork}")).json()["forked_from"] == body["forked_from"]
    assert body["conversation"]["forked_from"] == body["forked_from"]
    async with rig.db.transaction(read_only=True) as tx:
        origin = await tx.conversation_forks.get(fork)
    assert (origin.parent_conversation_id, origin.source_message_id) == (cid, asked[1]["response"]["id"])
    read = await user.get(f"/v1/conversations/{fork}/fork")
    assert read.status_code == 200 and read.json() == body["forked_from"]
    assert (await user.get(f"/v1/conversations/{cid}/fork")).status_code == 404  # not a fork


async def test_only_the_owner_forks_and_bad_requests_are_4xx(rig: Rig) -> None:
    owner = rig.client(token=False, cookie="01" * 32, origin=ORIGIN)
    cid = await new_conversation(owner)
    posted = await ask(owner, cid, "still going?")
    answer, question = posted["response"]["id"], posted["input"]["id"]

    streaming = await owner.post(f"/v1/conversations/{cid}/messages/{answer}/fork", json={"mode": "retry"})
    assert streaming.status_code == 409 and error_of(streaming) == "conflict", streaming.text
    edit_streaming = await owner.post(
        f"/v1/conversations/{cid}/messages/{question}/fork", json={"mode": "edit", "text": "x"}
    )
    assert edit_streaming.status_code == 409
    await _answer(rig, posted["task_id"], "done")

    stranger = rig.client(token=False, cookie="02" * 32, origin=ORIGIN)
    refused = await stranger.post(f"/v1/conversations/{cid}/messages/{answer}/fork", json={"mode": "retry"})
    assert refused.status_code == 404 and error_of(refused) == "not_found"
    mine = (await owner.post(f"/v1/conversations/{cid}/messages/{answer}/fork", json={"mode": "retry"})).json()
    peek = await stranger.get(f"/v1/conversations/{mine['conversation_id']}/fork")
    assert peek.status_code == 404 and error_of(peek) == "not_found"
    operator = await rig.operator().post(f"/v1/conversations/{cid}/messages/{answer}/fork", json={"mode": "retry"})
    assert operator.status_code == 403 and error_of(operator) == "forbidden"
    no_origin = rig.client(token=False, cookie="01" * 32)
    csrf = await no_origin.post(f"/v1/conversations/{cid}/messages/{answer}/fork", json={"mode": "retry"})
    assert csrf.status_code == 403

    other = await new_conversation(owner)
    for path, body, status in (
        (f"/v1/conversations/no-such/messages/{answer}/fork", {"mode": "retry"}, 404),
        (f"/v1/conversations/{cid}/messages/no-such/fork", {"mode": "retry"}, 404),
        (f"/v1/conversations/{other}/messages/{answer}/fork", {"mode": "retry"}, 404),  # not in that conversation
        (f"/v1/conversations/{cid}/messages/{question}/fork", {"mode": "retry"}, 400),  # a question, not an answer
        (f"/v1/conversations/{cid}/messages/{answer}/fork", {"mode": "edit", "text": "x"}, 400),  # an answer
        (f"/v1/conversations/{cid}/messages/{question}/fork", {"mode": "edit"}, 400),  # no text
        (f"/v1/conversations/{cid}/messages/{question}/fork", {"mode": "edit", "text": "  "}, 400),
        (f"/v1/conversations/{cid}/messages/{answer}/fork", {"mode": "retry", "text": "x"}, 400),
        (f"/v1/conversations/{cid}/messages/{answer}/fork", {"mode": "again"}, 400),
        (f"/v1/conversations/{cid}/messages/{answer}/fork", {"mode": "retry", "extra": 1}, 400),
    ):
        response = await owner.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        assert "error" in response.json()
    # Nothing was forked by any of them: the owner has the two conversations and the one fork.
    assert len((await owner.get("/v1/conversations")).json()["data"]) == 3
