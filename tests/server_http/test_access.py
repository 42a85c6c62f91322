"""Who is trusted, and for what: peers beyond loopback, one-time sign-in links, actor tokens, responders' Tasks.

A request's peer address is the ASGI ``client``; ``remote()`` clients come from 192.0.2.9 (a documentation
address), whatever ``Host`` they send — the way a forged ``Host`` reaches a server bound beyond loopback.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from loopd.server.audit import ledger_router
from loopd.server.engine import engine_router
from loopd.server.http import human_key
from loopd.server.ledger import SqlLedgerStore
from tests.server_http.support import BASE, Rig, ask, error_of, new_conversation, text_events

REMOTE_PEER = ("192.0.2.9", 50123)


def remote(rig: Rig, *, base_url: str = BASE, **options: Any) -> httpx.AsyncClient:
    """A client whose connection comes from another machine (its Host header still says 127.0.0.1)."""
    transport = httpx.ASGITransport(app=rig.app, raise_app_exceptions=False, client=REMOTE_PEER)
    return rig.client(base_url=base_url, transport=transport, **{"token": False, **options})


def cookie_of(response: httpx.Response) -> str:
    match = re.match(r"loopd-human=([0-9a-f]{64}); ", response.headers.get("set-cookie", ""))
    assert match is not None, response.headers
    return match.group(1)


async def signin_path(rig: Rig) -> str:
    created = await rig.client().post("/v1/signin-links", json={})
    assert created.status_code == 201, created.text
    path = str(created.json()["path"])
    assert path.startswith("/signin?code=")
    return path


async def actor_token(rig: Rig, actor: str) -> str:
    issued = await rig.client().post("/v1/tokens", json={"actor": actor})
    assert issued.status_code == 201, issued.text
    assert issued.json()["actor"] == actor
    return str(issued.json()["token"])


def bearer(rig: Rig, token: str, *, actor: str | None = None) -> httpx.AsyncClient:
    client = rig.client(token=False, actor=actor)
    client.headers["Authorization"] = f"Bearer {token}"
    return client


# --- browsers: trust from the peer address, never from Host --------------------------------------------------


async def test_a_forged_host_from_a_remote_peer_gets_no_cookie_and_no_access(rig: Rig) -> None:
    browser = remote(rig)  # Host: 127.0.0.1:8080, peer 192.0.2.9
    page = await browser.get("/")
    assert page.status_code == 200 and "set-cookie" not in page.headers
    me = await browser.get("/v1/me")
    assert me.status_code == 401 and error_of(me) == "unauthorized"
    assert "set-cookie" not in me.headers and "signin-link" in me.json()["error"]["message"]
    # A cookie the server never issued through a sign-in link counts for nothing from there, read or write.
    forged = remote(rig, cookie="ab" * 32, origin=BASE)
    for method, path in [("GET", "/v1/conversations"), ("POST", "/v1/conversations"), ("GET", "/v1/me")]:
        response = await forged.request(method, path, json={} if method == "POST" else None)
        assert response.status_code == 401, path
        assert error_of(response) == "unauthorized"
    # The same cookie from this machine's own browser is that browser's identity, as before.
    local = await rig.client(token=False, cookie="ab" * 32).get("/v1/me")
    assert local.json() == {"kind": "user", "key": human_key("ab" * 32), "trusted": False}


async def test_a_browser_relayed_by_a_reverse_proxy_on_this_machine_is_remote(rig: Rig) -> None:
    # The proxy connects from loopback and (like a default nginx) passes Host: 127.0.0.1; it says whom it relays.
    proxied = rig.client(token=False)
    proxied.headers["X-Forwarded-For"] = "198.51.100.7"
    page = await proxied.get("/")
    assert page.status_code == 200 and "set-cookie" not in page.headers
    assert (await proxied.get("/v1/me")).status_code == 401
    # A sign-in link works through the proxy as from anywhere.
    signed = await proxied.get(await signin_path(rig))
    assert signed.status_code == 303
    assert (await proxied.get("/v1/me")).json()["key"] == human_key(cookie_of(signed))


async def test_an_unknown_peer_is_not_loopback(rig: Rig) -> None:
    transport = httpx.ASGITransport(app=rig.app, raise_app_exceptions=False, client=("testclient", 1))
    assert (await rig.client(token=False, transport=transport).get("/v1/me")).status_code == 401


async def test_a_sign_in_link_works_once_and_only_once(rig: Rig) -> None:
    path = await signin_path(rig)
    browser = remote(rig)
    signed = await browser.get(path)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    assert "HttpOnly" in signed.headers["set-cookie"] and "SameSite=Strict" in signed.headers["set-cookie"]
    assert signed.headers["cache-control"] == "no-store"
    cookie = cookie_of(signed)
    me = await browser.get("/v1/me")  # the client kept the cookie
    assert me.json() == {"kind": "user", "key": human_key(cookie), "trusted": False}
    created = await remote(rig, cookie=cookie, origin=BASE).post("/v1/conversations", json={"name": "remote"})
    assert created.status_code == 201 and created.json()["actor_key"] == human_key(cookie)
    # Writes from that browser still need our Origin.
    assert (await remote(rig, cookie=cookie).post("/v1/conversations", json={})).status_code == 403

    again = await remote(rig).get(path)
    assert again.status_code == 403 and error_of(again) == "forbidden"
    assert "set-cookie" not in again.headers
    for bad in ("/signin?code=" + "x" * 43, "/signin?code=short", "/signin"):
        response = await remote(rig).get(bad)
        assert response.status_code in (400, 403), bad
        assert "set-cookie" not in response.headers


async def test_a_sign_in_link_expires(rig: Rig) -> None:
    path = await signin_path(rig)
    await rig.clock.advance(rig.ctx.security.signin_ttl + 1)
    late = await remote(rig).get(path)
    assert late.status_code == 403 and error_of(late) == "forbidden"


async def test_two_redemptions_of_one_link_make_one_cookie(rig: Rig) -> None:
    path = await signin_path(rig)
    results = await asyncio.gather(*(remote(rig).get(path) for _ in range(5)))
    assert sorted(r.status_code for r in results) == [303, 403, 403, 403, 403]


async def test_only_the_admin_makes_sign_in_links_and_tokens(rig: Rig) -> None:
    local_browser = rig.client(token=False, cookie="cd" * 32, origin=BASE)
    operator = rig.operator("echo")  # the admin token speaking as an operator has that operator's rights only
    router = bearer(rig, await actor_token(rig, "operator:router"))
    for client in (local_browser, operator, router):
        for path, body in [("/v1/signin-links", {}), ("/v1/tokens", {"actor": "operator:x"})]:
            response = await client.post(path, json=body)
            assert response.status_code == 403, (path, response.text)
            assert error_of(response) == "forbidden"
    assert (await remote(rig).post("/v1/signin-links", json={})).status_code == 401


# --- tokens: one identity each ---------------------------------------------------------------------------------


async def test_an_actor_token_is_exactly_its_actor(rig: Rig) -> None:
    token = await actor_token(rig, "operator:router")
    assert (await bearer(rig, token).get("/v1/me")).json() == {"kind": "operator", "key": "router", "trusted": True}
    same = await bearer(rig, token, actor="operator:router").get("/v1/me")
    assert same.json()["key"] == "router"
    for other in ("operator:echo", "harness:assistant"):
        response = await bearer(rig, token, actor=other).get("/v1/me")
        assert response.status_code == 403 and error_of(response) == "forbidden", other
    # It cannot register as another actor either.
    assert (await bearer(rig, token).put("/v1/operators/echo", json={})).status_code == 403
    assert (await bearer(rig, token).put("/v1/operators/router", json={})).status_code == 200
    # From another machine the token works the same (it is the credential).
    assert (await remote(rig).get("/v1/me")).status_code == 401
    far = remote(rig)
    far.headers["Authorization"] = f"Bearer {token}"
    assert (await far.get("/v1/me")).json()["key"] == "router"


async def test_tokens_are_for_operators_and_harnesses_and_can_be_revoked(rig: Rig) -> None:
    admin = rig.client()
    for bad in ("user:local", "user:mallory", "router", "robot:x"):
        response = await admin.post("/v1/tokens", json={"actor": bad})
        assert response.status_code == 400 and error_of(response) == "invalid_request", bad
    first = await actor_token(rig, "harness:remote")
    second = await actor_token(rig, "harness:remote")
    assert first != second
    revoked = await admin.delete("/v1/tokens/harness:remote")
    assert revoked.json() == {"actor": "harness:remote", "revoked": 2}
    for token in (first, second):
        response = await bearer(rig, token).get("/v1/me")
        assert response.status_code == 401 and error_of(response) == "unauthorized"


async def test_the_admin_token_is_the_admin_and_may_name_an_operator(rig: Rig) -> None:
    assert (await rig.client().get("/v1/me")).json() == {"kind": "user", "key": "local", "trusted": True}
    named = await rig.client(actor="operator:echo").get("/v1/me")
    assert named.json() == {"kind": "operator", "key": "echo", "trusted": True}


# --- responders act only on Tasks addressed to them ------------------------------------------------------------


async def test_a_responder_writes_only_to_tasks_addressed_to_it(rig: Rig) -> None:
    user = rig.client(token=False, cookie="ef" * 32, origin=BASE)
    task_id = (await ask(user, await new_conversation(user), target="operator:echo"))["task_id"]
    router = bearer(rig, await actor_token(rig, "operator:router"))
    echo = bearer(rig, await actor_token(rig, "operator:echo"))
    ask_body = {"effect_key": "q1", "type": "confirm", "title": "Ok?", "prompt": "Go on?", "timeout_seconds": 60}
    writes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"/v1/tasks/{task_id}", None),
        ("GET", f"/v1/tasks/{task_id}/messages", None),
        ("GET", f"/v1/tasks/{task_id}/followups", None),
        ("POST", f"/v1/tasks/{task_id}/events", {"events": text_events("t", "hijacked")}),
        ("POST", f"/v1/tasks/{task_id}/human", ask_body),
        ("POST", f"/v1/tasks/{task_id}/complete", {}),
    ]
    # Another operator's token, and the admin user itself, are refused (403 with the envelope).
    for client in (router, rig.client()):
        for method, path, body in writes:
            response = await client.request(method, path, json=body)
            assert response.status_code == 403, (method, path, response.text)
            assert error_of(response) == "forbidden"
    # The Task's own responder may.
    for method, path, body in writes:
        response = await echo.request(method, path, json=body)
        assert response.status_code in (200, 201), (method, path, response.text)
        if path.endswith("/human"):  # a pending question holds completion: end it with an error instead
            writes[-1] = ("POST", f"/v1/tasks/{task_id}/complete", {"error": {"code": "x", "message": "stop"}})


class _NoEngine:
    """Stands in for the Harness Engine where a request must be refused before it is reached."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine was reached ({name})")


async def test_a_responder_starts_harness_calls_only_into_its_own_tasks(rig: Rig) -> None:
    engine: Any = _NoEngine()
    rig.app.include_router(engine_router(engine, asker_of=rig.task_api.asker_of, tasks=rig.task_api))
    user = rig.client(token=False, cookie="ef" * 32, origin=BASE)
    cid = await new_conversation(user)
    theirs = await ask(user, cid, target="operator:echo")
    router = bearer(rig, await actor_token(rig, "operator:router"))
    call = {"owner_uid": "uid-1", "effect_key": "work/0", "target": "assistant", "text": "write into it"}
    for body in (
        {**call, "message_id": theirs["response"]["id"]},  # no task: only the admin starts those
        {**call, "message_id": theirs["response"]["id"], "task_id": theirs["task_id"]},  # not its Task
        {**call, "conversation_id": cid, "task_id": theirs["task_id"]},
    ):
        response = await router.post("/v1/harness/calls", json=body)
        assert response.status_code == 403, (body, response.text)
        assert error_of(response) == "forbidden"
    assert (await router.put("/v1/operators/router", json={})).status_code == 200  # now a known target
    mine = await ask(user, cid, target="operator:router")
    # Its own Task, but a destination in someone else's Task: refused too.
    crossed = {**call, "message_id": theirs["response"]["id"], "task_id": mine["task_id"]}
    response = await router.post("/v1/harness/calls", json=crossed)
    assert response.status_code == 403 and "not part of task" in response.json()["error"]["message"]


async def test_a_responder_reads_the_trail_of_its_own_tasks_only(rig: Rig) -> None:
    rig.app.include_router(ledger_router(SqlLedgerStore(rig.db), tasks=rig.task_api, conversations=rig.conversations))
    user = rig.client(token=False, cookie="ef" * 32, origin=BASE)
    task_id = (await ask(user, await new_conversation(user), target="operator:echo"))["task_id"]
    router = bearer(rig, await actor_token(rig, "operator:router"))
    echo = bearer(rig, await actor_token(rig, "operator:echo"))
    refused = await router.get("/v1/ledger", params={"task_id": task_id})
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    no_task = await echo.get("/v1/ledger", params={"conversation_id": "anything"})
    assert no_task.status_code == 403 and error_of(no_task) == "forbidden"
    assert (await echo.get("/v1/ledger", params={"task_id": task_id})).status_code == 200
    assert (await rig.client().get("/v1/ledger", params={"task_id": task_id})).status_code == 200  # the admin


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
async def test_loopback_peers_in_every_spelling_get_the_local_cookie(rig: Rig, peer: str) -> None:
    transport = httpx.ASGITransport(app=rig.app, raise_app_exceptions=False, client=(peer, 1))
    page = await rig.client(token=False, transport=transport).get("/")
    assert cookie_of(page)


async def test_only_digests_of_issued_secrets_are_stored(rig: Rig) -> None:
    token = await actor_token(rig, "operator:router")
    path = await signin_path(rig)
    cookie = cookie_of(await remote(rig).get(path))
    code = path.removeprefix("/signin?code=")
    async with rig.db.transaction(read_only=True) as tx:
        rows = [
            *await tx.fetch("SELECT * FROM access_tokens"),
            *await tx.fetch("SELECT * FROM signin_codes"),
            *await tx.fetch("SELECT * FROM browser_cookies"),
        ]
    stored = repr(rows)
    assert len(rows) == 3
    for secret in (token, code, cookie):
        assert secret not in stored
