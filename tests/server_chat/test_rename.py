"""`PATCH /v1/conversations/{id}` {name}: the owner renames a conversation; nobody else can, nor rename a work
conversation; errors are the envelope, the route is in the OpenAPI document."""

from __future__ import annotations

from tests.server_http.support import ORIGIN, Rig, ask, error_of, new_conversation


async def test_the_owner_renames_a_conversation(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user, "first")
    before = (await user.get(f"/v1/conversations/{cid}")).json()
    renamed = await user.patch(f"/v1/conversations/{cid}", json={"name": "Three brothers"})
    assert renamed.status_code == 200, renamed.text
    body = renamed.json()
    assert body["id"] == cid and body["name"] == "Three brothers"
    assert body["updated_at"] >= before["updated_at"]
    assert (await user.get("/v1/conversations")).json()["data"][0]["name"] == "Three brothers"
    cleared = await user.patch(f"/v1/conversations/{cid}", json={"name": ""})
    assert cleared.status_code == 200 and cleared.json()["name"] == ""


async def test_a_browser_renames_its_own_with_its_origin(rig: Rig) -> None:
    cookie = "ef" * 32
    browser = rig.client(token=False, cookie=cookie, origin=ORIGIN)
    cid = await new_conversation(browser)
    assert (await browser.patch(f"/v1/conversations/{cid}", json={"name": "mine"})).json()["name"] == "mine"
    no_origin = rig.client(token=False, cookie=cookie)
    refused = await no_origin.patch(f"/v1/conversations/{cid}", json={"name": "csrf"})
    assert refused.status_code == 403 and error_of(refused) == "forbidden"
    assert (await browser.get(f"/v1/conversations/{cid}")).json()["name"] == "mine"


async def test_nobody_else_renames_it(rig: Rig) -> None:
    owner = rig.client(token=False, cookie="01" * 32, origin=ORIGIN)
    cid = await new_conversation(owner, "kept")
    stranger = rig.client(token=False, cookie="02" * 32, origin=ORIGIN)
    response = await stranger.patch(f"/v1/conversations/{cid}", json={"name": "taken"})
    assert response.status_code == 404 and error_of(response) == "not_found"
    operator = await rig.operator().patch(f"/v1/conversations/{cid}", json={"name": "taken"})
    assert operator.status_code == 403 and error_of(operator) == "forbidden"
    missing = await owner.patch("/v1/conversations/no-such-conversation", json={"name": "x"})
    assert missing.status_code == 404 and error_of(missing) == "not_found"
    assert (await owner.get(f"/v1/conversations/{cid}")).json()["name"] == "kept"


async def test_a_work_conversation_keeps_its_name(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    task_id = (await ask(user, cid))["task_id"]
    output = await rig.task_api.open_output(task_id, actor_kind="harness", actor_key="assistant", title="plan")
    response = await user.patch(f"/v1/conversations/{output.conversation_id}", json={"name": "mine now"})
    assert response.status_code == 400 and error_of(response) == "invalid_request"


async def test_bad_bodies_are_400(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    for body in ({}, {"name": 3}, {"name": "x" * 201}, {"name": "x", "extra": 1}, {"title": "x"}):
        response = await user.patch(f"/v1/conversations/{cid}", json=body)
        assert response.status_code == 400, (body, response.text)
        assert error_of(response) == "invalid_request"


async def test_the_route_is_documented(rig: Rig) -> None:
    document = (await rig.client().get("/openapi.json")).json()
    operation = document["paths"]["/v1/conversations/{conversation_id}"]["patch"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/RenameConversationRequest"}
    assert set(operation["responses"]) >= {"200", "400", "404"}
    assert "422" not in operation["responses"]
