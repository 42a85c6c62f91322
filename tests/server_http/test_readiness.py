"""``/readyz``: ready while the database answers and the server is not shutting down; 503 otherwise; no credentials."""

from __future__ import annotations

from tests.server_http.support import Rig, error_of


async def test_readyz_is_public_and_ok_while_the_database_answers(rig: Rig) -> None:
    response = await rig.client(token=False).get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ok": True}


async def test_readyz_is_503_once_the_database_is_closed(rig: Rig) -> None:
    await rig.db.aclose()
    response = await rig.client(token=False).get("/readyz")
    assert response.status_code == 503
    assert error_of(response) == "service_unavailable"
    # anyone may ask: no driver message or address reaches the caller (the reason goes to the server's log)
    assert response.json()["error"]["message"] == "the database does not answer"
    assert (await rig.client(token=False).get("/healthz")).status_code == 200  # alive, just not ready


async def test_readyz_is_503_while_shutting_down(rig: Rig) -> None:
    rig.app.state.begin_shutdown()
    response = await rig.client(token=False).get("/readyz")
    assert response.status_code == 503
    assert error_of(response) == "service_unavailable"
    assert "shutting down" in response.json()["error"]["message"]
