"""The front door: tokens, actors, the browser cookie, CSRF (Origin), JSON-only writes, body cap, the envelope."""

from __future__ import annotations

import hashlib
import re

import httpx
from fastapi import APIRouter

from loopd.server.http import ServerSecurity, human_key
from tests.server_http.support import BASE, ORIGIN, Rig, build_rig, error_of, new_conversation


async def test_no_credentials_is_401_with_the_envelope(rig: Rig) -> None:
    client = rig.client(token=False)
    for method, path in [("GET", "/v1/conversations"), ("POST", "/v1/conversations"), ("GET", "/v1/actors")]:
        response = await client.request(method, path, json={} if method == "POST" else None)
        assert response.status_code == 401
        assert error_of(response) == "unauthorized"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_public_paths_need_nothing(rig: Rig) -> None:
    client = rig.client(token=False)
    assert (await client.get("/healthz")).json() == {"ok": True}
    assert (await client.get("/openapi.json")).status_code == 200
    assert (await client.get("/docs")).status_code == 200


async def test_a_wrong_token_is_401_and_a_right_one_is_the_cli_user(rig: Rig) -> None:
    wrong = rig.client(token=False)
    wrong.headers["Authorization"] = "Bearer not-the-token"
    assert (await wrong.get("/v1/me")).status_code == 401
    assert (await rig.client().get("/v1/me")).json() == {"kind": "user", "key": "local", "trusted": True}


async def test_x_loopd_actor_names_an_operator_or_harness_only_with_a_token(rig: Rig) -> None:
    assert (await rig.client(actor="operator:router").get("/v1/me")).json() == {
        "kind": "operator",
        "key": "router",
        "trusted": True,
    }
    assert (await rig.client(actor="harness:assistant").get("/v1/me")).json()["kind"] == "harness"
    for bad in ("router", "user:mallory", "robot:x", "operator:"):
        response = await rig.client(actor=bad).get("/v1/me")
        assert response.status_code == 400, bad
        assert error_of(response) == "invalid_request"
    response = await rig.client(token=False, actor="operator:router").get("/v1/me")
    assert response.status_code == 401


async def test_get_root_sets_the_cookie_identity_and_it_is_used(rig: Rig) -> None:
    browser = rig.client(token=False)
    page = await browser.get("/")
    assert page.status_code == 200
    assert "<html" in page.text.lower()  # the web UI, or the page saying how to build it (tests/web checks both)
    set_cookie = page.headers["set-cookie"]
    match = re.match(r"loopd-human=([0-9a-f]{64}); ", set_cookie)
    assert match is not None, set_cookie
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={365 * 24 * 3600}"):
        assert attribute in set_cookie
    value = match.group(1)
    expected = "human-" + hashlib.sha256(value.encode()).hexdigest()[:32]
    assert human_key(value) == expected
    me = await browser.get("/v1/me")  # the client kept the cookie
    assert me.json() == {"kind": "user", "key": expected, "trusted": False}
    assert "set-cookie" not in me.headers


async def test_v1_me_issues_a_cookie_when_missing(rig: Rig) -> None:
    browser = rig.client(token=False)
    first = await browser.get("/v1/me")
    assert first.status_code == 200 and "loopd-human=" in first.headers["set-cookie"]
    second = await browser.get("/v1/me")
    assert second.json()["key"] == first.json()["key"]
    other = await rig.client(token=False).get("/v1/me")
    assert other.json()["key"] != first.json()["key"]


async def test_cookie_writes_need_our_own_origin(rig: Rig) -> None:
    cookie = "ab" * 32
    without = rig.client(token=False, cookie=cookie)
    response = await without.post("/v1/conversations", json={})
    assert response.status_code == 403 and error_of(response) == "forbidden"
    foreign = rig.client(token=False, cookie=cookie, origin="http://evil.example")
    assert (await foreign.post("/v1/conversations", json={})).status_code == 403
    other_port = rig.client(token=False, cookie=cookie, origin="http://127.0.0.1:9999")
    assert (await other_port.post("/v1/conversations", json={})).status_code == 403
    same = rig.client(token=False, cookie=cookie, origin=ORIGIN)
    created = await same.post("/v1/conversations", json={"name": "mine"})
    assert created.status_code == 201
    assert created.json()["actor_key"] == human_key(cookie)
    # Reads need no Origin.
    assert (await without.get("/v1/conversations")).json()["data"][0]["name"] == "mine"


async def test_cookie_identities_only_on_loopback_or_allowed_hosts(rig: Rig) -> None:
    browser = rig.client(token=False, cookie="cd" * 32, base_url="http://rebound.example:8080")
    response = await browser.get("/v1/me")
    assert response.status_code == 403 and error_of(response) == "forbidden"
    fresh = rig.client(token=False, base_url="http://rebound.example:8080")
    page = await fresh.get("/")
    assert page.status_code == 200 and "set-cookie" not in page.headers
    # Tokens work on any host.
    assert (await rig.client(base_url="http://rebound.example:8080").get("/v1/me")).status_code == 200
    allowed = build_rig(rig.db, rig.clock, browser_hosts=frozenset({"rebound.example"}))
    browser = allowed.client(token=False, cookie="cd" * 32, base_url="http://rebound.example:8080")
    assert (await browser.get("/v1/me")).json()["key"] == human_key("cd" * 32)
    await allowed.aclose()


async def test_writes_take_json_only_and_bodies_are_capped(rig: Rig) -> None:
    client = rig.client()
    form = await client.post("/v1/conversations", content=b"name=x", headers={"Content-Type": "text/plain"})
    assert form.status_code == 415 and error_of(form) == "unsupported_media_type"
    broken = await client.post("/v1/conversations", content=b"{", headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and error_of(broken) == "invalid_request"
    array = await client.post("/v1/conversations", json=[1, 2])
    assert array.status_code == 400
    small = build_rig(rig.db, rig.clock, max_body_bytes=100)
    big = await small.client().post("/v1/conversations", json={"name": "x" * 200})
    assert big.status_code == 413 and error_of(big) == "payload_too_large"
    await small.aclose()


async def test_validation_errors_are_400_never_422(rig: Rig) -> None:
    client = rig.client()
    response = await client.post("/v1/conversations", json={"name": 5})
    assert response.status_code == 400 and error_of(response) == "invalid_request"
    response = await client.post("/v1/conversations", json={"unknown": True})
    assert response.status_code == 400
    response = await client.get("/v1/conversations?limit=0")
    assert response.status_code == 400
    schema = (await client.get("/openapi.json")).json()
    text = str(schema)
    assert "'422'" not in text and "HTTPValidationError" not in text
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "cookie"}
    assert "/v1/conversations/{conversation_id}/messages" in schema["paths"]


async def test_unknown_routes_and_methods_use_the_envelope(rig: Rig) -> None:
    client = rig.client()
    missing = await client.get("/v1/nothing-here")
    assert missing.status_code == 404 and error_of(missing) == "not_found"
    wrong = await client.delete("/v1/actors")
    assert wrong.status_code == 405 and error_of(wrong) == "invalid_request"


async def test_a_bug_is_a_500_without_a_traceback(rig: Rig) -> None:
    router = APIRouter()

    @router.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals /etc/passwd")

    buggy = build_rig(rig.db, rig.clock, routers=[router])
    response = await buggy.client().get("/v1/boom")
    assert response.status_code == 500 and error_of(response) == "internal_error"
    assert "secret" not in response.text and "Traceback" not in response.text
    await buggy.aclose()


async def test_conversations_are_owner_only(rig: Rig) -> None:
    alice = rig.client(token=False, cookie="a1" * 32, origin=ORIGIN)
    bob = rig.client(token=False, cookie="b2" * 32, origin=ORIGIN)
    cid = await new_conversation(alice, "alice's")
    assert (await alice.get(f"/v1/conversations/{cid}")).status_code == 200
    for path in ("", "/messages", "/snapshot", "/stream"):
        response = await bob.get(f"/v1/conversations/{cid}{path}")
        assert response.status_code == 404, path
        assert error_of(response) == "not_found"
    assert (await bob.get("/v1/conversations")).json()["data"] == []
    ask = await bob.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "operator", "key": "echo"}, "text": "hi"}
    )
    assert ask.status_code == 404
    # The CLI user (token) is yet another owner.
    assert (await rig.client().get(f"/v1/conversations/{cid}")).status_code == 404


async def test_browsers_cannot_use_the_task_or_registry_api(rig: Rig) -> None:
    browser = rig.client(token=False, cookie="c3" * 32, origin=ORIGIN)
    calls: list[tuple[str, str, dict[str, object] | None]] = [
        ("GET", "/v1/tasks/some-task", None),
        ("POST", "/v1/tasks/some-task/complete", {}),
        ("PUT", "/v1/operators/router", {}),
    ]
    for method, path, body in calls:
        response = await browser.request(method, path, json=body)
        assert response.status_code == 403, path
        assert error_of(response) == "forbidden"


def test_security_settings_are_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="non-empty"):
        ServerSecurity(tokens=("",))
    with pytest.raises(ValueError, match="positive"):
        ServerSecurity(max_body_bytes=0)
    assert ServerSecurity().is_public("/healthz") and not ServerSecurity().is_public("/v1/me")
    assert httpx.URL(BASE).host == "127.0.0.1"
