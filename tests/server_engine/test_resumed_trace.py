"""W3C trace context stored with a harness call: a call resumed by another replica (here: a second engine after the
first one crashed) continues the trace of the request that created it, instead of starting a new one. The remote
harness is a real ``loopd harness serve`` app on loopback; spans go to the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry import trace

from loopd._infra.clock import VirtualClock
from loopd.harness.serve import create_app, open_harness_server
from loopd.server.engine import CallRequest, RemoteHarnessAdapter
from loopd.server.storage import HARNESS_CALL_TRACE_PARAM, Database
from tests.support.tracing import named, recorded_spans

from .conftest import content_of, make_engine, new_conversation, new_response, until_done, until_phase
from .rigs import Harness, open_rig

TOKEN = "trace-token"


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[tuple[Harness, str]]:
    async with (
        open_rig(tmp_path / "remote") as harness,
        open_harness_server(create_app(harness.rig, token=TOKEN)) as server,
    ):
        yield harness, server.url


async def test_a_call_resumed_on_another_replica_continues_the_callers_trace(
    remote: tuple[Harness, str], sqlite_db: Database, clock: VirtualClock
) -> None:
    _harness, url = remote
    with recorded_spans() as exporter:
        first_adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30)
        first = make_engine(sqlite_db, {"remote": first_adapter}, clock=clock, replica_id="first")
        await first.open()
        conversation = await new_conversation(sqlite_db)
        response = await new_response(sqlite_db, conversation)
        with trace.get_tracer("test").start_as_current_span("user asks") as asked:
            call = await first.start(
                CallRequest("uid-t", "respond", "remote", "write a.txt", message_id=response, asker="user:alice")
            )
        await until_phase(first, call.id, "waiting_input")
        await first.abort()  # the first replica crashes while the harness waits for permission
        await first_adapter.aclose()
        stored = (await first.get(call.id)).params[HARNESS_CALL_TRACE_PARAM]
        assert stored["traceparent"].split("-")[1] == format(asked.get_span_context().trace_id, "032x")

        await clock.advance(31)
        second_adapter = RemoteHarnessAdapter(url, TOKEN, timeout=30)
        second = make_engine(sqlite_db, {"remote": second_adapter}, clock=clock, replica_id="second")
        content = await content_of(sqlite_db, response)
        gate = next(b["id"] for b in content["blocks"] if b["type"] == "ask").removeprefix("gate/")
        await second.answer_gate(call.id, gate, "approve", "user:alice")
        async with second:  # not started under any span: only the stored context can link it
            done = await until_done(second, call.id, timeout=20)
        await second_adapter.aclose()
        spans = list(exporter.get_finished_spans())
    assert done.phase == "succeeded", done.error
    calls = named(spans, "loopd.harness_call")
    assert calls, sorted(span.name for span in spans)
    trace_id = asked.get_span_context().trace_id
    # Every drive of the call — the second replica's too — is a child of the span that asked.
    assert all(span.context is not None and span.context.trace_id == trace_id for span in calls)
    assert all(span.parent is not None and span.parent.span_id == asked.get_span_context().span_id for span in calls)
    outcomes = [(span.attributes or {}).get("loopd.harness_call.outcome") for span in calls]
    assert len(calls) == 2 and outcomes[-1] == "done", outcomes  # the crashed drive, then the second replica's
