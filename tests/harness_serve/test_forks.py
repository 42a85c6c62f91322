"""POST /v1/sessions/{id}/fork: a new live session with the parent's history up to a settled seq; the same
bearer token and Idempotency-Key rules as session creation; typed 4xx for bad seqs and unknown sessions."""

from __future__ import annotations

from loopd.harness import SqliteJournal

from .conftest import client_for, scripted_rig, serving, text_reply


async def test_a_fork_continues_the_parents_history_at_a_settled_seq(journal: SqliteJournal) -> None:
    rig = scripted_rig(journal, [text_reply("first"), text_reply("parent's second"), text_reply("fork's second")])
    async with serving(rig) as served:
        created = await served.client.post("/v1/sessions", json={"input": "one"})
        parent = created.json()["id"]
        await served.session(parent).wait_idle(timeout=30)
        settled = served.session(parent).last_seq  # session_started, turn_started, turn_done
        await served.client.post(f"/v1/sessions/{parent}/inputs", json={"text": "two"})
        await served.session(parent).wait_idle(timeout=30)

        forked = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": settled})
        assert forked.status_code == 201, forked.text
        body = forked.json()
        fork = body["id"]
        assert forked.headers["location"] == f"/v1/sessions/{fork}"
        assert (body["parent_id"], body["parent_seq"], body["live"], body["status"]) == (
            parent,
            settled,
            True,
            "active",
        )
        assert body["loops"][0]["last_reply"] == "first" and body["turns"] == 1
        assert body["last_seq"] == settled + 2  # its own: session_forked, session_restored

        page = (await served.client.get(f"/v1/sessions/{fork}/journal", params={"limit": 100})).json()
        kinds = [item["kind"] for item in page["items"]]
        assert kinds == [
            "session_started",
            "turn_started",
            "context_measured",
            "turn_done",
            "session_forked",
            "session_restored",
        ]
        await served.client.post(f"/v1/sessions/{fork}/inputs", json={"text": "two, differently"})
        await served.session(fork).wait_idle(timeout=30)
        views = [(await served.client.get(f"/v1/sessions/{s}")).json() for s in (parent, fork)]
        assert [v["loops"][0]["last_reply"] for v in views] == ["parent's second", "fork's second"]
        listed = {item["id"] for item in (await served.client.get("/v1/sessions")).json()["items"]}
        assert {parent, fork} <= listed


async def test_fork_refusals_are_typed_4xx(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("hi")])) as served:
        parent = (await served.client.post("/v1/sessions", json={"input": "one"})).json()["id"]
        await served.session(parent).wait_idle(timeout=30)
        last = served.session(parent).last_seq

        inside = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 2})  # turn_started
        assert inside.status_code == 400, inside.text
        error = inside.json()["error"]
        assert error["type"] == "invalid_request"
        assert "inside a turn" in error["message"] and "last settled seq before it is 1" in error["message"]

        past = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": last + 1})
        assert (past.status_code, past.json()["error"]["type"]) == (400, "invalid_request")
        for bad in (
            {"at_seq": 0},
            {"at_seq": "x"},
            {},
            {"at_seq": 1, "extra": True},
            {"at_seq": 1, "session_id": "a b"},
        ):
            response = await served.client.post(f"/v1/sessions/{parent}/fork", json=bad)
            assert (response.status_code, response.json()["error"]["type"]) == (400, "invalid_request"), bad
        unknown = await served.client.post("/v1/sessions/nope/fork", json={"at_seq": 1})
        assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "not_found")

        named = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1, "session_id": "mine"})
        assert named.status_code == 201 and named.json()["id"] == "mine"
        taken = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1, "session_id": parent})
        assert (taken.status_code, taken.json()["error"]["type"]) == (409, "conflict")
        sessions = {item["id"] for item in (await served.client.get("/v1/sessions")).json()["items"]}
        assert sessions == {parent, "mine"}  # no refusal created anything


async def test_an_idempotency_key_returns_the_same_fork(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("hi")])) as served:
        parent = (await served.client.post("/v1/sessions", json={"input": "one"})).json()["id"]
        await served.session(parent).wait_idle(timeout=30)
        key = {"Idempotency-Key": "fork-1"}
        first = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1}, headers=key)
        again = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1}, headers=key)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["id"] == again.json()["id"]
        other = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 3}, headers=key)
        assert (other.status_code, other.json()["error"]["type"]) == (409, "conflict")
        # A key used to create a session is not a fork's key.
        await served.client.post("/v1/sessions", json={}, headers={"Idempotency-Key": "create-1"})
        reused = await served.client.post(
            f"/v1/sessions/{parent}/fork", json={"at_seq": 1}, headers={"Idempotency-Key": "create-1"}
        )
        assert reused.status_code == 409


async def test_forking_needs_the_servers_bearer_token(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [text_reply("hi")]), token="s3cret-token") as served:
        parent = (await served.client.post("/v1/sessions", json={"input": "one"})).json()["id"]
        await served.session(parent).wait_idle(timeout=30)
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with client_for(served.url, headers=headers) as stranger:
                refused = await stranger.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1})
                assert (refused.status_code, refused.json()["error"]["type"]) == (401, "unauthorized")
        assert [item["id"] for item in (await served.client.get("/v1/sessions")).json()["items"]] == [parent]
        allowed = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 1})
        assert allowed.status_code == 201
