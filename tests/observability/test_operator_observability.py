"""An operator (loop-runtime) answering a question: its reconcile pass is an ``invoke_agent <key>`` span of the
question's trace (through the Task's annotation) and the calls it makes to the server continue it; its reconciles
show up in the metrics it reports into. And the standalone operator's metrics endpoint: who may scrape it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopd._infra.metrics import Metrics, MetricsExposureError, open_metrics_server
from loopd.runtime import Result, Runtime, Task, open_runtime
from loopd.server import UpSettings, open_loop_server
from loopd.server._composition import RunningServer
from tests.support.tracing import named, parent_of
from tests.support.waiting import eventually


class Echo:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def reconcile(self, task: Task) -> Result | None:
        context = await self.rt.task.get(task.id)
        if context.response.status == "streaming":
            await self.rt.chat.answer(task.id, context.input.text)
        await self.rt.chat.complete(task.id)
        return None


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with open_loop_server(UpSettings(data_dir=tmp_path / "data", port=0)) as running:
        yield running


async def test_an_operators_answer_joins_the_question_trace_and_its_reconciles_are_counted(
    server: RunningServer, spans: InMemorySpanExporter
) -> None:
    metrics = Metrics()
    token = server.token_file.read_text().strip()
    async with (
        open_runtime(data_dir=server.data_dir) as rt,
        httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=15) as user,
    ):
        rt.report_metrics(metrics, "echo")
        await rt.register("echo")
        rt.task.watch("echo", Echo(rt))
        runner = asyncio.create_task(rt.run())
        try:
            conversation = (await user.post("/v1/conversations", json={"name": "op"})).json()["id"]
            asked = await user.post(
                f"/v1/conversations/{conversation}/messages",
                json={"target": {"kind": "operator", "key": "echo"}, "text": "hello"},
            )
            assert asked.status_code == 201, asked.text
            task_id = asked.json()["task_id"]

            async def answered() -> bool | None:
                page = (await user.get(f"/v1/conversations/{conversation}/messages")).json()["data"]
                response = next(m for m in page if m["id"] == asked.json()["response"]["id"])
                return True if response["status"] == "completed" else None

            await eventually(answered, timeout=30, what="the operator's answer")
            labels = {"component": "echo", "controller": "tasks:operator:echo"}
            await eventually(
                lambda: metrics.registry.get_sample_value("loopd_reconcile_seconds_count", labels),
                what="the reconcile's latency",
            )
            exposition = metrics.exposition().decode()
            assert 'loopd_reconcile_queue_depth{component="echo",controller="tasks:operator:echo"}' in exposition
        finally:
            rt.shutdown()
            await asyncio.wait_for(runner, 30)
    recorded = spans.get_finished_spans()
    requests = named(recorded, "loopd.chat.request")
    [request] = [span for span in requests if (span.attributes or {}).get("loopd.task.id") == task_id]
    passes = named(recorded, "invoke_agent echo")
    assert passes and all(parent_of(recorded, span) is request for span in passes)
    assert passes[0].attributes is not None and passes[0].attributes["gen_ai.agent.name"] == "echo"
    # The operator's own calls to the server (its answer, the completion) are server spans under its pass.
    children = [s for s in recorded if parent_of(recorded, s) in passes]
    assert any(span.name.startswith("POST /v1/tasks/") for span in children), [s.name for s in children]


async def test_the_standalone_metrics_endpoint_needs_its_token_or_loopback() -> None:
    metrics = Metrics()
    metrics.chat_requests.labels("operator").inc()
    async with open_metrics_server(metrics, port=0, token="s3cret") as url, httpx.AsyncClient(timeout=15) as client:
        assert (await client.get(f"{url}/metrics")).status_code == 401
        assert (await client.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"})).status_code == 401
        scraped = await client.get(f"{url}/metrics", headers={"Authorization": "Bearer s3cret"})
        assert scraped.status_code == 200 and 'loopd_chat_requests_total{target_kind="operator"} 1.0' in scraped.text
    async with open_metrics_server(metrics, port=0) as url, httpx.AsyncClient(timeout=15) as client:
        assert (await client.get(f"{url}/metrics")).status_code == 200  # loopback, no token configured
    with pytest.raises(MetricsExposureError, match="LOOPD_METRICS_TOKEN"):
        async with open_metrics_server(metrics, host="0.0.0.0", port=0):
            pass
