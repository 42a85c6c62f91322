"""`harness serve`: a session's active loop, a loop's mode and model over HTTP (auth and errors as the neighbours)."""

from __future__ import annotations

from loopd.harness import BUILD, PLAN, EchoTool, LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.gate import MemoryRuleStore
from tests.support.waiting import eventually

from .conftest import client_for, serving
from .test_errors_and_auth import assert_envelope


def modal_rig(journal: SqliteJournal, model: ScriptedModel) -> Rig:
    main = LoopDefinition(name="main", model=model, tools=(EchoTool(),), modes=(BUILD, PLAN), context_window=4000)
    side = LoopDefinition(name="side", model=model)
    return Rig(loops=[main, side], journal=journal, name="test", rules=MemoryRuleStore())


async def test_mode_model_and_active_loop_over_http(journal: SqliteJournal) -> None:
    model = ScriptedModel([], default=Reply(text="ok"))
    async with serving(modal_rig(journal, model), token="s3cret-token") as served:
        client = served.client
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        base = f"/v1/sessions/{sid}"

        mode = await client.post(f"{base}/loops/main/mode", json={"mode": "plan"})
        assert mode.status_code == 202, mode.text
        assert mode.json() == {
            "session_id": sid,
            "loop": "main",
            "setting": "mode",
            "value": "plan",
            "status": "accepted",
        }
        inference = await client.post(f"{base}/loops/main/inference", json={"model": "large"})
        assert inference.status_code == 202 and inference.json()["value"] == "large"
        active = await client.post(f"{base}/active-loop", json={"loop": "side"})
        assert active.status_code == 200 and active.json()["status"] == "set"

        async def settled() -> dict[str, object] | None:
            body = (await client.get(base)).json()
            main = body["loops"][0]
            return body if (main["mode"], main["model"]) == ("plan", "large") else None

        body = await eventually(settled, timeout=10)
        assert body["active_loop"] == "side"
        accepted = (await client.post(f"{base}/inputs", json={"text": "hi"})).json()
        assert accepted["loop"] == "side"  # no loop named: the active one

        # Unknown names are a 400 envelope; an unknown session a 404, as for every route.
        assert_envelope(await client.post(f"{base}/loops/main/mode", json={"mode": "fly"}), 400, "invalid_request")
        assert_envelope(await client.post(f"{base}/loops/side/mode", json={"mode": "plan"}), 400, "invalid_request")
        assert_envelope(await client.post(f"{base}/loops/nope/inference", json={"model": "x"}), 400, "invalid_request")
        assert_envelope(await client.post(f"{base}/active-loop", json={"loop": "nope"}), 400, "invalid_request")
        assert_envelope(await client.post(f"{base}/active-loop", json={}), 400, "invalid_request")
        assert_envelope(await client.post("/v1/sessions/none/active-loop", json={"loop": "main"}), 404, "not_found")

        # The same token as every route: without it nothing changes.
        async with client_for(served.url) as anonymous:
            for path, payload in (
                (f"{base}/active-loop", {"loop": "main"}),
                (f"{base}/loops/main/mode", {"mode": "build"}),
                (f"{base}/loops/main/inference", {"model": "small"}),
            ):
                assert_envelope(await anonymous.post(path, json=payload), 401, "unauthorized")
        final = (await client.get(base)).json()
        assert final["active_loop"] == "side" and final["loops"][0]["mode"] == "plan"

        # Restored by another server over the same journal, the settings hold.
        session = served.session(sid)
        await session.wait_idle(timeout=10)
    async with serving(modal_rig(journal, model)) as again:
        restored = (await again.client.post(f"/v1/sessions/{sid}/restore")).json()
        assert restored["active_loop"] == "side"
        assert (restored["loops"][0]["mode"], restored["loops"][0]["model"]) == ("plan", "large")
