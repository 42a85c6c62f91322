"""The real `loopd server` process with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: a question's spans reach a real OTLP/HTTP
receiver on loopback as one trace, and ``/metrics`` answers the admin token."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.support.otlp import ReceivedSpan, otlp_receiver
from tests.support.waiting import eventually, wait_until

from .conftest import UpProcess, start_up


async def test_loopd_server_exports_one_trace_per_question_over_otlp(tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        # Blocking waits run off the loop: the receiver answers the server's exports on it.
        server = await asyncio.to_thread(start_up, tmp_path / "data", tmp_path, "server", env=env, command="server")
        try:
            headers = {"Authorization": f"Bearer {server.token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=15) as client:
                conversation = (await client.post("/v1/conversations", json={"name": "traced"})).json()["id"]
                asked = await client.post(
                    f"/v1/conversations/{conversation}/messages",
                    json={"target": {"kind": "harness", "key": "assistant"}, "text": "hello"},
                )
                assert asked.status_code == 201, asked.text
                task_id = asked.json()["task_id"]

                def question_trace() -> list[ReceivedSpan] | None:
                    spans = receiver.spans()
                    request = next((s for s in spans if s.attributes.get("loopd.task.id") == task_id), None)
                    if request is None:
                        return None
                    mine = [s for s in spans if s.trace_id == request.trace_id]
                    return mine if any(s.name == "loopd.harness_call" for s in mine) else None

                spans = await eventually(question_trace, timeout=30, what="the question's spans at the receiver")
                metrics = await client.get("/metrics")
        finally:
            await asyncio.to_thread(server.kill, signal.SIGTERM)
    names = {span.name for span in spans}
    assert {"loopd.chat.request", "loopd.task", "loopd.harness_call", "invoke_agent main"} <= names, names
    assert any(name.startswith("chat ") for name in names), names
    assert all(span.service == "loopd" for span in spans)
    by_id = {span.span_id: span for span in spans}
    call = next(span for span in spans if span.name == "loopd.harness_call")
    assert by_id[call.parent_span_id].name == "loopd.task"
    assert by_id[by_id[call.parent_span_id].parent_span_id].name == "loopd.chat.request"
    assert metrics.status_code == 200
    values: dict[str, Any] = dict(line.rsplit(" ", 1) for line in metrics.text.splitlines() if line[:1] != "#")
    assert float(values['loopd_chat_requests_total{target_kind="harness"}']) == 1.0
    assert float(values["loopd_gc_frozen_objects"]) > 20_000  # what it built while starting (loopd._infra.heap)


def _frozen(client: httpx.Client) -> float | None:
    metrics = client.get("/metrics")
    assert metrics.status_code == 200, metrics.text
    for line in metrics.text.splitlines():
        if line.startswith("loopd_gc_frozen_objects "):
            value = float(line.split()[1])
            return value if value > 0 else None
    raise AssertionError("no loopd_gc_frozen_objects in /metrics")


def test_loopd_up_freezes_what_it_built_while_starting(up: UpProcess) -> None:
    # Its modules, schemas, app and operators: tens of thousands of objects full collections no longer walk.
    with up.client() as client:
        frozen = wait_until(lambda: _frozen(client), timeout=30, what="loopd up to freeze its startup heap")
        assert frozen > 20_000
        collections = client.get("/metrics").text
    assert 'python_gc_collections_total{generation="2"}' in collections
