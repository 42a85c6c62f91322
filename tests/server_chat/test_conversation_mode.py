"""`PUT /v1/conversations/{id}/mode`: the mode a conversation's built-in harness calls start in, set by its owner
only (another user: 404 as for posting, an operator: 403, a browser without its Origin: 403), shown in every
conversation body, reset with null; unknown modes are 400."""

from __future__ import annotations

from tests.server_http.support import ORIGIN, Rig, error_of, new_conversation


async def test_only_the_owner_sets_the_mode_and_every_body_shows_it(rig: Rig) -> None:
    owner = rig.client(token=False, cookie="01" * 32, origin=ORIGIN)
    cid = await new_conversation(owner, "modes")
    assert (await owner.get(f"/v1/conversations/{cid}")).json()["mode"] is None  # each harness's own

    set_plan = await owner.put(f"/v1/conversations/{cid}/mode", json={"mode": "plan"})
    assert set_plan.status_code == 200, set_plan.text
    assert set_plan.json()["id"] == cid and set_plan.json()["mode"] == "plan"
    assert (await owner.get(f"/v1/conversations/{cid}")).json()["mode"] == "plan"
    listed = (await owner.get("/v1/conversations")).json()["data"]
    assert [c["mode"] for c in listed if c["id"] == cid] == ["plan"]

    stranger = rig.client(token=False, cookie="02" * 32, origin=ORIGIN)
    refused = await stranger.put(f"/v1/conversations/{cid}/mode", json={"mode": "build"})
    assert refused.status_code == 404 and error_of(refused) == "not_found"
    operator = await rig.operator().put(f"/v1/conversations/{cid}/mode", json={"mode": "build"})
    assert operator.status_code == 403 and error_of(operator) == "forbidden"
    no_origin = rig.client(token=False, cookie="01" * 32)
    assert (await no_origin.put(f"/v1/conversations/{cid}/mode", json={"mode": "build"})).status_code == 403
    assert (await owner.get(f"/v1/conversations/{cid}")).json()["mode"] == "plan"  # none of them changed it

    for body in ({"mode": "yolo"}, {}, {"mode": "plan", "extra": 1}, {"mode": 3}):
        bad = await owner.put(f"/v1/conversations/{cid}/mode", json=body)
        assert bad.status_code == 400 and error_of(bad) == "invalid_request", body
    assert (await owner.put("/v1/conversations/no-such/mode", json={"mode": "plan"})).status_code == 404

    reset = await owner.put(f"/v1/conversations/{cid}/mode", json={"mode": None})
    assert reset.status_code == 200 and reset.json()["mode"] is None
