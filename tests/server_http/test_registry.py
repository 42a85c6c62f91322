"""Registry leases (virtual time), validation, the picker's list and who may register what."""

from __future__ import annotations

from tests.server_http.support import ORIGIN, Rig, error_of


async def _actors(rig: Rig) -> list[tuple[str, str]]:
    body = (await rig.client().get("/v1/actors")).json()
    return [(a["kind"], a["key"]) for a in body["data"]]


async def test_leases_expire_in_virtual_time_and_renewal_extends_them(rig: Rig) -> None:
    router = rig.client(actor="operator:router")
    response = await router.put("/v1/operators/router", json={"display_name": "Router", "lease_seconds": 30})
    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "operator" and response.json()["lease_seconds"] == 30
    default = await rig.client(actor="harness:remote").put("/v1/harnesses/remote", json={})
    assert default.json()["lease_seconds"] == 30  # the default lease
    assert ("operator", "router") in await _actors(rig)
    await rig.clock.advance(20)
    await router.put("/v1/operators/router", json={"display_name": "Router", "lease_seconds": 30})  # renewed
    await rig.clock.advance(20)
    live = await _actors(rig)
    assert ("operator", "router") in live and ("harness", "remote") not in live  # 40 s > 30 s, never renewed
    await rig.clock.advance(11)
    assert ("operator", "router") not in await _actors(rig)


async def test_the_list_puts_operators_first_and_always_has_the_builtin_targets(rig: Rig) -> None:
    await rig.client(actor="harness:alpha").put("/v1/harnesses/alpha", json={"description": "a"})
    await rig.client(actor="operator:zeta").put("/v1/operators/zeta", json={})
    data = (await rig.client().get("/v1/actors")).json()["data"]
    kinds = [a["kind"] for a in data]
    assert kinds == sorted(kinds, key=lambda k: k != "operator")
    assert {
        "kind": "harness",
        "key": "assistant",
        "display_name": "Assistant",
        "description": "The built-in harness",
        "modes": [],  # this rig's built-in actor declares none (loopd up's built-in harnesses: build, plan)
        "mode": None,
    } in data
    assert [(a["kind"], a["key"]) for a in data] == [
        ("operator", "echo"),
        ("operator", "zeta"),
        ("harness", "alpha"),
        ("harness", "assistant"),
    ]
    await rig.clock.advance(3600)
    assert await _actors(rig) == [("operator", "echo"), ("harness", "assistant")]  # built-ins never expire


async def test_bad_leases_and_keys_are_400(rig: Rig) -> None:
    client = rig.client()
    for lease in (0, -5, 301, 1e9, "long"):
        response = await client.put("/v1/operators/x", json={"lease_seconds": lease})
        assert response.status_code == 400, lease
        assert error_of(response) == "invalid_request"
    assert (await client.put("/v1/operators/x", json={"lease_seconds": 300})).status_code == 200
    assert (await client.put("/v1/operators/bad key!", json={})).status_code in (400, 404)
    assert (await client.put("/v1/operators/x", json={"extra": 1})).status_code == 400


async def test_only_token_callers_register_and_only_under_their_own_key(rig: Rig) -> None:
    other = await rig.client(actor="operator:router").put("/v1/operators/longhorizon", json={})
    assert other.status_code == 403 and error_of(other) == "forbidden"
    kind = await rig.client(actor="operator:router").put("/v1/harnesses/router", json={})
    assert kind.status_code == 403
    browser = rig.client(token=False, cookie="ee" * 32, origin=ORIGIN)
    assert (await browser.put("/v1/operators/router", json={})).status_code == 403
    assert (await browser.get("/v1/actors")).status_code == 200  # but a browser may list
    assert (await rig.client().put("/v1/operators/anything", json={})).status_code == 200  # the CLI user may


async def test_a_chat_target_must_be_known(rig: Rig) -> None:
    client = rig.client()
    cid = (await client.post("/v1/conversations", json={})).json()["id"]
    unknown = await client.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "operator", "key": "ghost"}, "text": "hi"}
    )
    assert unknown.status_code == 400 and "ghost" in unknown.json()["error"]["message"]
    await rig.client(actor="operator:ghost").put("/v1/operators/ghost", json={"lease_seconds": 1})
    await rig.clock.advance(10)  # expired, but known: it may come back and pick the Task up
    known = await client.post(
        f"/v1/conversations/{cid}/messages", json={"target": {"kind": "operator", "key": "ghost"}, "text": "hi"}
    )
    assert known.status_code == 201


async def test_one_responders_status_needs_a_signed_in_caller(rig: Rig) -> None:
    anonymous = await rig.client(token=False).get("/v1/actors/operator/router")
    assert anonymous.status_code == 401
    assert error_of(anonymous) == "unauthorized"
    known = await rig.client().get("/v1/actors/harness/nobody")
    assert known.status_code == 200 and known.json()["connected"] is False
