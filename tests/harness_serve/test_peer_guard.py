"""`loopd harness serve` without a token answers this machine only: by the connection's peer, not its Host."""

from __future__ import annotations

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from loopd._infra.http import peer_is_loopback
from loopd.harness.serve._guard import Guard


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _client(peer: str, *, token: str | None = None) -> httpx.AsyncClient:
    guard = Guard(_ok, token=token, max_body_bytes=1024)
    transport = httpx.ASGITransport(app=guard, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", timeout=5.0)


async def test_a_remote_peer_forging_a_loopback_host_is_refused() -> None:
    async with _client("192.0.2.9") as remote:
        for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765"):
            response = await remote.get("/v1/sessions", headers={"Host": host})
            assert response.status_code == 403, host
            assert response.json()["error"]["type"] == "forbidden"
            assert "this machine" in response.json()["error"]["message"]


async def test_a_loopback_peer_is_answered_unless_the_host_is_foreign() -> None:
    for peer in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        async with _client(peer) as local:
            assert (await local.get("/v1/sessions")).status_code == 200, peer
            rebinding = await local.get("/v1/sessions", headers={"Host": "attacker.example:8765"})
            assert rebinding.status_code == 403


async def test_with_a_token_any_peer_that_presents_it_is_answered() -> None:
    async with _client("192.0.2.9", token="secret-token") as remote:
        assert (await remote.get("/v1/sessions")).status_code == 401
        answered = await remote.get("/v1/sessions", headers={"Authorization": "Bearer secret-token"})
        assert answered.status_code == 200


async def test_a_request_relayed_by_a_local_reverse_proxy_is_not_local() -> None:
    async with _client("127.0.0.1") as proxied:
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            response = await proxied.get("/v1/sessions", headers={header: "for=198.51.100.7"})
            assert response.status_code == 403, header


@pytest.mark.parametrize(
    ("client", "expected"),
    [(("127.0.0.1", 1), True), (("::1", 1), True), (("10.0.0.1", 1), False), (("localhost", 1), False), (None, False)],
)
def test_peer_is_loopback_reads_the_address_only(client: tuple[str, int] | None, expected: bool) -> None:
    assert peer_is_loopback({"type": "http", "client": client}) is expected
