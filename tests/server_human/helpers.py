"""Helpers for the Human suites: a question asked by a browser user and answered over the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.server_http.support import ORIGIN, Rig, ask, new_conversation, task_object

ALICE = "a1" * 32
BOB = "b2" * 32


@dataclass
class Asked:
    user: httpx.AsyncClient
    operator: httpx.AsyncClient
    conversation_id: str
    task_id: str
    input: dict[str, Any]
    response: dict[str, Any]


async def asked(rig: Rig, *, cookie: str = ALICE, text: str = "please decide") -> Asked:
    """A browser user's question to operator:echo."""
    user = rig.client(token=False, cookie=cookie, origin=ORIGIN)
    cid = await new_conversation(user)
    accepted = await ask(user, cid, text)
    return Asked(user, rig.operator(), cid, accepted["task_id"], accepted["input"], accepted["response"])


def ask_body(effect_key: str = "q1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect_key": effect_key,
        "type": "ask",
        "title": "Pick one",
        "prompt": "Which database?",
        "timeout_seconds": 60,
        "choices": [{"value": "pg", "label": "PostgreSQL"}, {"value": "sqlite", "label": "SQLite"}],
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def confirm_body(effect_key: str = "c1", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect_key": effect_key,
        "type": "confirm",
        "title": "Deploy?",
        "prompt": "Deploy to production now?",
        "timeout_seconds": 60,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


async def question(a: Asked, body: dict[str, Any]) -> dict[str, Any]:
    response = await a.operator.post(f"/v1/tasks/{a.task_id}/human", json=body)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


async def reply(
    a: Asked,
    message_id: str | None,
    outcome: str = "success",
    value: str | None = None,
    *,
    client: httpx.AsyncClient | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {"outcome": outcome}
    if message_id is not None:
        body["reply_to_message_id"] = message_id
    if value is not None:
        body["value"] = value
    return await (client or a.user).post(f"/v1/conversations/{a.conversation_id}/tasks/{a.task_id}/replies", json=body)


async def state(a: Asked, message_id: str) -> dict[str, Any]:
    response = await a.user.get(f"/v1/human/{message_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def revision(rig: Rig, task_id: str) -> int | None:
    task = await task_object(rig, task_id)
    return None if task is None else int(task["spec"]["revision"])


async def conversation_messages(a: Asked) -> list[dict[str, Any]]:
    return list((await a.user.get(f"/v1/conversations/{a.conversation_id}/messages")).json()["data"])
