"""A user's follow-up with two whole loop-servers (`open_loop_server`) on one PostgreSQL: the question is asked on
replica A, the follow-up on replica B. Both replicas' responders see the follow-up's Task; the one whose engine
drives the running call hands the follow-up to it, the other waits ("elsewhere") instead of answering it itself. So
the model is asked twice in all (the tool step, then the answer with the follow-up), never for the follow-up alone,
and the follow-up's own answer says it went to the answer in progress.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness.models import (
    IncomingRequest,
    ModelConfig,
    ScriptedServer,
    ServerReply,
    ServerToolCall,
    open_scripted_server,
)
from loopd.harness.tools import resolve_sandbox
from loopd.server import UpSettings, open_loop_server
from loopd.server.responder import FOLLOWUP_ANSWER
from tests.support.postgres import postgres_dsn, postgres_server
from tests.support.titles import is_title_request
from tests.support.waiting import eventually

__all__ = ["postgres_dsn", "postgres_server"]

pytestmark = pytest.mark.postgres

FOLLOWUP = "Also mention bananas."


def _texts(request: IncomingRequest) -> str:
    return "\n".join(str(message.get("content") or "") for message in request.messages)


def _reply(request: IncomingRequest) -> ServerReply:
    if "bananas" in _texts(request):
        return ServerReply(text="Listed; and bananas.")
    if not any(message.get("role") == "tool" for message in request.messages):
        return ServerReply(tool_calls=(ServerToolCall(name="list_dir", arguments={"path": "."}),))
    return ServerReply(text="Listed.")


async def _message(client: httpx.AsyncClient, conversation_id: str, message_id: str) -> dict[str, Any]:
    page = (await client.get(f"/v1/conversations/{conversation_id}/messages", params={"limit": 200})).json()
    found: dict[str, Any] = next(m for m in page["data"] if m["id"] == message_id)
    return found


def _answer(message: dict[str, Any]) -> str:
    return "".join(str(b.get("content") or "") for b in message["content"].get("blocks", []) if b.get("id") == "answer")


async def test_a_follow_up_asked_on_another_replica_reaches_the_running_call(tmp_path: Path, postgres_dsn: str) -> None:
    model = ScriptedServer(_reply, models=("gpt-4o-mini",))
    async with open_scripted_server(model) as base_url:

        def settings(name: str) -> UpSettings:
            return UpSettings(
                data_dir=tmp_path / name,
                port=0,
                database_url=postgres_dsn,
                model=ModelConfig(model="gpt-4o-mini", base_url=base_url),
                sandbox=resolve_sandbox("none"),
            )

        async with open_loop_server(settings("a")) as a, open_loop_server(settings("b")) as b:
            on_a = httpx.AsyncClient(
                base_url=a.url, headers={"Authorization": f"Bearer {a.token_file.read_text().strip()}"}, timeout=15
            )
            on_b = httpx.AsyncClient(
                base_url=b.url, headers={"Authorization": f"Bearer {b.token_file.read_text().strip()}"}, timeout=15
            )
            async with on_a, on_b:
                conversation = (await on_a.post("/v1/conversations", json={"name": "replicas"})).json()["id"]
                target = {"kind": "harness", "key": "assistant"}
                first = await on_a.post(
                    f"/v1/conversations/{conversation}/messages", json={"target": target, "text": "List the files."}
                )
                assert first.status_code == 201, first.text
                response_id = first.json()["response"]["id"]

                async def pending_gate() -> dict[str, Any] | None:
                    blocks = (await _message(on_b, conversation, response_id))["content"].get("blocks", [])
                    return next((b for b in blocks if b.get("type") == "ask" and b.get("status") == "pending"), None)

                gate = await eventually(pending_gate, timeout=30, what="the tool's permission request")
                second = await on_b.post(
                    f"/v1/conversations/{conversation}/messages", json={"target": target, "text": FOLLOWUP}
                )
                assert second.status_code == 201, second.text

                async def ended(message_id: str) -> dict[str, Any] | None:
                    message = await _message(on_b, conversation, message_id)
                    return message if message["status"] not in ("pending", "streaming") else None

                followup = await eventually(
                    lambda: ended(second.json()["response"]["id"]), timeout=30, what="the follow-up's answer"
                )
                assert followup["status"] == "completed" and _answer(followup) == FOLLOWUP_ANSWER, followup
                gate_id = str(gate["id"]).removeprefix("gate/")
                approved = await on_b.post(
                    f"/v1/harness/calls/{gate['call_id']}/gates/{gate_id}", json={"answer": "approve"}
                )
                assert approved.status_code == 200, approved.text
                answer = await eventually(lambda: ended(response_id), timeout=30, what="the first answer")
                assert answer["status"] == "completed" and "bananas" in _answer(answer), answer
                # The conversation's title is written by a model call of its own (a background run): not the harness's.
                calls = [r for r in model.requests if not is_title_request(r)]
                assert len(calls) == 2, [_texts(r)[-200:] for r in calls]
                assert FOLLOWUP in _texts(calls[1])
