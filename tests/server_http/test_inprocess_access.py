"""Who can reach the server through `InProcessTransport` (`loopd up`'s operators): exactly who could over the socket.
Its requests carry a loopback peer address, and that grants nothing — the same credentials are checked."""

from __future__ import annotations

import httpx

from loopd._infra.inprocess import InProcessTransport
from tests.server_http.support import TOKEN, Rig


def _in_process(rig: Rig, headers: dict[str, str]) -> httpx.AsyncClient:
    transport = InProcessTransport(rig.app, fallback=httpx.AsyncHTTPTransport())
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8420", headers=headers, timeout=10)


async def test_a_request_without_credentials_is_refused_as_over_the_socket(rig: Rig) -> None:
    async with _in_process(rig, {}) as anonymous:
        response = await anonymous.get("/v1/actors")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "unauthorized"


async def test_a_wrong_token_is_refused_and_the_right_one_works(rig: Rig) -> None:
    async with _in_process(rig, {"Authorization": "Bearer not-the-token"}) as wrong:
        assert (await wrong.get("/v1/actors")).status_code == 401
    async with _in_process(rig, {"Authorization": f"Bearer {TOKEN}"}) as admin:
        assert (await admin.get("/v1/actors")).status_code == 200


async def test_an_operator_acting_through_it_is_held_to_its_own_rights(rig: Rig) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Loopd-Actor": "operator:router"}
    async with _in_process(rig, headers) as router:
        own = await router.put("/v1/operators/router", json={"display_name": "Router"})
        other = await router.put("/v1/operators/longhorizon", json={"display_name": "Not mine"})
    assert own.status_code == 200, own.text
    assert other.status_code == 403
