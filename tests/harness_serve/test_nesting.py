"""Deeply nested JSON bodies get 400 and the envelope on `loopd harness serve`, never a 500."""

from __future__ import annotations

import pytest

from loopd._infra.http import MAX_JSON_DEPTH
from loopd.harness import SqliteJournal

from .conftest import scripted_rig, serving
from .test_errors_and_auth import assert_envelope


def _nested(levels: int) -> bytes:
    opening = "".join('{"a":' if level % 2 else "[" for level in range(levels))
    closing = "".join("}" if level % 2 else "]" for level in reversed(range(levels)))
    return f'{{"text": "hi", "loop": {opening}"x"{closing}}}'.encode()


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH, 500, 940, 5000])
async def test_deeply_nested_inputs_are_refused_with_400(journal: SqliteJournal, levels: int) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        for route in (f"/v1/sessions/{session_id}/inputs", "/v1/sessions"):
            answer = await served.client.post(
                route, content=_nested(levels), headers={"Content-Type": "application/json"}
            )
            assert_envelope(answer, 400, "invalid_request")
            assert f"more than {MAX_JSON_DEPTH} levels deep" in answer.json()["error"]["message"]
        assert (await served.client.get(f"/v1/sessions/{session_id}")).json()["last_seq"] == 1  # nothing reached it


async def test_a_body_at_the_cap_is_parsed(journal: SqliteJournal) -> None:
    async with serving(scripted_rig(journal, [])) as served:
        session_id = (await served.client.post("/v1/sessions", json={})).json()["id"]
        answer = await served.client.post(
            f"/v1/sessions/{session_id}/inputs",
            content=_nested(MAX_JSON_DEPTH - 1),  # the body's own object is the 64th level
            headers={"Content-Type": "application/json"},
        )
        assert_envelope(answer, 400, "invalid_request")  # parsed and refused by the schema: `loop` is no name
        assert "levels deep" not in answer.json()["error"]["message"]
