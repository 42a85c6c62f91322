"""A user's follow-up reaches a running built-in harness call as queued input (the harness's queued-input rule).

loop-server in process (`open_loop_server`, the built-in ``assistant`` on a scripted OpenAI-compatible model over
loopback HTTP). The question starts a turn whose first model reply asks for a tool that needs the user's
permission; while the turn waits on that gate the user sends a follow-up to the same harness, then approves. The
follow-up is folded into the running turn at the next step boundary (after the tool), so the model's next request
holds it and the first answer covers it; the follow-up's own Task is answered "Added to the answer in progress."
and no second harness call is made. No timing is involved: the gate holds the turn open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

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
from tests.support.titles import is_title_request
from tests.support.waiting import eventually

FOLLOWUP = "Also mention bananas."


def _texts(request: IncomingRequest) -> str:
    return "\n".join(str(message.get("content") or "") for message in request.messages)


def _reply(request: IncomingRequest) -> ServerReply:
    if "bananas" in _texts(request):
        return ServerReply(text="The workspace is listed; and bananas, as you asked.")
    if not any(message.get("role") == "tool" for message in request.messages):
        return ServerReply(tool_calls=(ServerToolCall(name="list_dir", arguments={"path": "."}),))
    return ServerReply(text="The workspace is listed.")  # the follow-up never reached the model


async def _message(client: httpx.AsyncClient, conversation_id: str, message_id: str) -> dict[str, Any]:
    page = (await client.get(f"/v1/conversations/{conversation_id}/messages", params={"limit": 200})).json()
    found: dict[str, Any] = next(m for m in page["data"] if m["id"] == message_id)
    return found


def _answer(message: dict[str, Any]) -> str:
    return "".join(str(b.get("content") or "") for b in message["content"].get("blocks", []) if b.get("id") == "answer")


async def test_a_follow_up_is_folded_into_the_running_harness_call(tmp_path: Path) -> None:
    model = ScriptedServer(_reply, models=("gpt-4o-mini",))
    async with open_scripted_server(model) as base_url:
        settings = UpSettings(
            data_dir=tmp_path / "data",
            port=0,
            model=ModelConfig(model="gpt-4o-mini", base_url=base_url),
            sandbox=resolve_sandbox("none"),
        )
        async with open_loop_server(settings) as server:
            token = server.token_file.read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=15) as client:
                conversation = (await client.post("/v1/conversations", json={"name": "follow-ups"})).json()["id"]
                target = {"kind": "harness", "key": "assistant"}
                first = await client.post(
                    f"/v1/conversations/{conversation}/messages", json={"target": target, "text": "List the files."}
                )
                assert first.status_code == 201, first.text
                response_id = first.json()["response"]["id"]

                async def pending_gate() -> dict[str, Any] | None:
                    message = await _message(client, conversation, response_id)
                    blocks = message["content"].get("blocks", [])
                    return next((b for b in blocks if b.get("type") == "ask" and b.get("status") == "pending"), None)

                gate = await eventually(pending_gate, timeout=30, what="the tool's permission request")

                second = await client.post(
                    f"/v1/conversations/{conversation}/messages", json={"target": target, "text": FOLLOWUP}
                )
                assert second.status_code == 201, second.text

                async def ended(message_id: str) -> dict[str, Any] | None:
                    message = await _message(client, conversation, message_id)
                    return message if message["status"] not in ("pending", "streaming") else None

                followup = await eventually(
                    lambda: ended(second.json()["response"]["id"]), timeout=30, what="the follow-up's answer"
                )
                gate_id = str(gate["id"]).removeprefix("gate/")
                approved = await client.post(
                    f"/v1/harness/calls/{gate['call_id']}/gates/{gate_id}", json={"answer": "approve"}
                )
                assert approved.status_code == 200, approved.text
                answer = await eventually(lambda: ended(response_id), timeout=30, what="the first answer")
                assert followup["status"] == "completed" and _answer(followup) == FOLLOWUP_ANSWER, followup
                assert answer["status"] == "completed", answer
                assert "bananas" in _answer(answer), answer
                # The model's second request (after the tool) held the follow-up; no call of its own was made.
                # The conversation's title is written by a model call of its own (a background run): not the harness's.
                calls = [r for r in model.requests if not is_title_request(r)]
                assert len(calls) == 2, [_texts(r)[-200:] for r in calls]
                assert FOLLOWUP in _texts(calls[1])
                trail = (await client.get("/v1/ledger", params={"task_id": second.json()["task_id"]})).json()
                assert trail["lanes"] == [], trail  # the follow-up's Task ran no harness call
