"""One question through a whole loop-server (`open_loop_server`, demo model, the built-in ``assistant``): with
tracing on it is one trace — the caller's span → ``loopd.chat.request`` → ``loopd.task`` → ``loopd.harness_call`` →
``invoke_agent`` → ``chat`` / ``execute_tool`` — and ``/metrics`` counts it; who may read ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from loopd._infra.telemetry import inject_headers
from loopd.server import UpSettings, open_loop_server
from loopd.server._composition import RunningServer
from tests.support.tracing import named, parent_of, recorded_spans
from tests.support.waiting import eventually

HARNESS = {"kind": "harness", "key": "assistant"}


def _admin(server: RunningServer) -> httpx.AsyncClient:
    token = server.token_file.read_text().strip()
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15)


async def _message(client: httpx.AsyncClient, conversation_id: str, message_id: str) -> dict[str, Any]:
    page = (await client.get(f"/v1/conversations/{conversation_id}/messages", params={"limit": 200})).json()
    found: dict[str, Any] = next(m for m in page["data"] if m["id"] == message_id)
    return found


async def _ask_with_a_tool(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Ask "list files" (the demo model calls ``list_dir``), approve the tool at its gate, wait for the answer."""
    conversation = (await client.post("/v1/conversations", json={"name": "observed"})).json()["id"]
    asked = await client.post(
        f"/v1/conversations/{conversation}/messages",
        json={"target": HARNESS, "text": "list files"},
        headers=headers or {},
    )
    assert asked.status_code == 201, asked.text
    response_id = asked.json()["response"]["id"]

    async def pending_gate() -> dict[str, Any] | None:
        blocks = (await _message(client, conversation, response_id))["content"].get("blocks", [])
        return next((b for b in blocks if b.get("type") == "ask" and b.get("status") == "pending"), None)

    gate = await eventually(pending_gate, timeout=30, what="the tool's permission request")
    gate_id = str(gate["id"]).removeprefix("gate/")
    approved = await client.post(f"/v1/harness/calls/{gate['call_id']}/gates/{gate_id}", json={"answer": "approve"})
    assert approved.status_code == 200, approved.text

    async def ended() -> dict[str, Any] | None:
        message = await _message(client, conversation, response_id)
        return message if message["status"] not in ("pending", "streaming") else None

    answer = await eventually(ended, timeout=30, what="the answer")
    assert answer["status"] == "completed", answer
    return dict(asked.json())


async def test_a_question_is_one_trace_from_the_chat_request_to_the_tool_call(tmp_path: Path) -> None:
    with recorded_spans() as exporter:
        async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as server, _admin(server) as client:
            with trace.get_tracer("test").start_as_current_span("user clicks send") as clicked:
                headers: dict[str, str] = {}
                inject_headers(headers)
            asked = await _ask_with_a_tool(client, headers)

            async def turn_ended() -> list[ReadableSpan] | None:
                spans = list(exporter.get_finished_spans())
                return spans if named(spans, "loopd.harness_call") else None

            spans = await eventually(turn_ended, timeout=30, what="the harness call's span")
    trace_id = clicked.get_span_context().trace_id
    mine = [span for span in spans if span.context is not None and span.context.trace_id == trace_id]

    def only(name: str) -> ReadableSpan:
        found = named(mine, name)
        assert len(found) == 1, (name, sorted(span.name for span in mine))
        return found[0]

    request = only("loopd.chat.request")
    assert request.attributes is not None and request.attributes["loopd.task.id"] == asked["task_id"]
    ancestors = [request]
    while (up := parent_of(mine, ancestors[-1])) is not None:
        ancestors.append(up)
    assert ancestors[-1].name == "user clicks send", [span.name for span in ancestors]  # through its traceparent
    server = next(span for span in ancestors if span.kind is SpanKind.SERVER)  # FastAPI's own server span
    assert server.attributes is not None
    assert server.attributes["http.route"] == "/v1/conversations/{conversation_id}/messages"
    # The responder's passes over the Task (one more when it came before the question's commit was visible).
    tasks = named(mine, "loopd.task")
    assert tasks and all(parent_of(mine, task) is request for task in tasks)  # through the Task's annotation
    call = only("loopd.harness_call")
    assert parent_of(mine, call) in tasks
    turn = only("invoke_agent main")
    assert parent_of(mine, turn) is call
    chats = [span for span in mine if span.name.startswith("chat ")]
    assert len(chats) == 2 and all(parent_of(mine, chat) is turn for chat in chats)
    assert all(chat.attributes is not None and chat.attributes["gen_ai.operation.name"] == "chat" for chat in chats)
    tool = only("execute_tool list_dir")
    assert parent_of(mine, tool) is turn


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


def _samples(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_metrics_count_a_question_and_its_harness_call(server: RunningServer) -> None:
    async with _admin(server) as client:
        await _ask_with_a_tool(client)
        scraped = await client.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain")
    values = _samples(scraped.text)
    assert values['loopd_chat_requests_total{target_kind="harness"}'] == 1.0
    assert values["loopd_chats_in_flight"] == 0.0  # asked and completed
    assert values['loopd_chat_seconds_count{outcome="completed"}'] == 1.0
    assert values['loopd_time_to_first_token_seconds_count{target="assistant"}'] == 1.0
    assert values['loopd_completion_seconds_count{outcome="done",target="assistant"}'] == 1.0
    input_tokens = [v for k, v in values.items() if k.startswith("loopd_model_tokens_total{") and 'type="input"' in k]
    assert input_tokens and input_tokens[0] > 0
    assert values["loopd_engine_capacity"] == 200.0
    assert values["loopd_engine_driving"] == 0.0
    assert values["loopd_harness_tasks_waiting"] == 0.0  # one chat, 50 slots: it never waited
    assert values["loopd_journal_commit_seconds_count"] >= 3  # the harness call's turn: started, replied, done
    assert "loopd_sse_subscribers" in values
    assert any(k.startswith('loopd_reconcile_queue_depth{component="server"') for k in values)
    assert any(k.startswith('loopd_reconcile_seconds_count{component="server"') and v >= 1 for k, v in values.items())
    route = 'loopd_http_requests_total{method="POST",route="/v1/conversations/{conversation_id}/messages",status="201"}'
    assert values[route] == 1.0


async def test_metrics_need_the_admin_token_or_an_actor_token(server: RunningServer) -> None:
    async with _admin(server) as admin:
        issued = await admin.post("/v1/tokens", json={"actor": "operator:prometheus"})
        assert issued.status_code == 201, issued.text
        actor_token = str(issued.json()["token"])
        browser = await admin.get("/v1/me")
        assert browser.status_code == 200
    async with httpx.AsyncClient(base_url=server.url, timeout=15) as anonymous:
        refused = await anonymous.get("/metrics")
        assert refused.status_code == 401, refused.text
        # This machine's own browser (loopback peer, loopback Host): a cookie user, not a service: 403.
        me = await anonymous.get("/v1/me")
        assert me.status_code == 200 and "loopd-human" in anonymous.cookies
        forbidden = await anonymous.get("/metrics")
        assert forbidden.status_code == 403, forbidden.text
        assert forbidden.json()["error"]["type"] == "forbidden"
        assert "loopd_" not in forbidden.text
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {actor_token}"}, timeout=15
    ) as prometheus:
        allowed = await prometheus.get("/metrics")
        assert allowed.status_code == 200 and "loopd_http_requests_total" in allowed.text
        wrong = await prometheus.get("/metrics", headers={"Authorization": "Bearer not-a-token"})
        assert wrong.status_code == 401
