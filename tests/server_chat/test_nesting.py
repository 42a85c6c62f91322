"""Deeply nested JSON bodies are refused with 400 and the envelope, never a 500 (RecursionError)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loopd._infra.http import MAX_JSON_DEPTH
from tests.server_http.support import Rig, ask, error_of, new_conversation, text_events


def _deep_body(outer: dict[str, Any], levels: int) -> bytes:
    """`outer` as JSON text with its "DEEP" string replaced by `levels` nested arrays/objects (written as text:
    json.dumps itself cannot encode the deepest values)."""
    deep = "".join('{"a":' if level % 2 else "[" for level in range(levels)) + '"x"'
    deep += "".join("}" if level % 2 else "]" for level in reversed(range(levels)))
    return json.dumps(outer).replace('"DEEP"', deep).encode()


_JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("levels", [500, 940, 5000])
async def test_deeply_nested_task_events_are_refused_with_400(rig: Rig, levels: int) -> None:
    user, operator = rig.client(), rig.operator()
    task_id = (await ask(user, await new_conversation(user)))["task_id"]
    body = {"events": [{"op": "set", "block": {"id": "a", "type": "text", "content": "", "x": "DEEP"}}]}
    answer = await operator.post(f"/v1/tasks/{task_id}/events", content=_deep_body(body, levels), headers=_JSON)
    assert answer.status_code == 400, answer.text
    assert error_of(answer) == "invalid_request"
    assert f"more than {MAX_JSON_DEPTH} levels" in answer.json()["error"]["message"]
    fine = await operator.post(f"/v1/tasks/{task_id}/events", json={"events": text_events("a", "ok")})
    assert fine.status_code == 200, fine.text  # the Task is unharmed


@pytest.mark.parametrize("levels", [500, 940, 5000])
async def test_deeply_nested_chat_messages_are_refused_with_400(rig: Rig, levels: int) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    model = {"version": "1.1", "biz": "app", "meta": {}, "blocks": [{"id": "q", "type": "text", "x": "DEEP"}]}
    body = {"target": {"kind": "operator", "key": "echo"}, "content": model}
    answer = await user.post(f"/v1/conversations/{cid}/messages", content=_deep_body(body, levels), headers=_JSON)
    assert answer.status_code == 400, answer.text
    assert error_of(answer) == "invalid_request"
    assert len(rig.gateway.created) == 0


async def test_nesting_within_the_cap_is_accepted(rig: Rig) -> None:
    user = rig.client()
    cid = await new_conversation(user)
    model = {"version": "1.1", "biz": "app", "meta": {}, "blocks": [{"id": "q", "type": "text", "x": "DEEP"}]}
    body = {"target": {"kind": "operator", "key": "echo"}, "content": model}
    # body → content → blocks → block: 4 levels around the value
    answer = await user.post(
        f"/v1/conversations/{cid}/messages", content=_deep_body(body, MAX_JSON_DEPTH - 4), headers=_JSON
    )
    assert answer.status_code == 201, answer.text
