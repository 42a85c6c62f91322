"""Child of `benchmarks.tracing_overhead`: ``--sessions`` sessions of ``--steps`` tool steps each, one after the
other, tracing ``on`` or ``off``; prints the mean wall time per step over the last ``--window`` steps of each session
(history near ``--steps``), and their mean, as JSON. Several sessions per process put more steps in the measured
windows for the same history length, so that one process's passing speed (this VM's runs differ by up to 1.7× from
one process to the next) weighs less.

``--model adapter`` (the default) runs every step the way a real loopd call runs it, like the peers benchmark:
loopd's OpenAI-compatible adapter (`OpenAICompatibleModel`) builds the provider request from the whole history and
sends it through an in-process OpenAI-compatible transport that answers with a pre-encoded streamed reply (the
peers' `benchmarks._peer_loopd` replies). ``--model scripted`` answers in process with a `ScriptedModel` instead:
no request is built, so the step is cheaper and tracing's fixed cost a larger share of it (reported beside the
adapter's figure, not judged).

``on`` installs the OpenTelemetry SDK's tracer provider with the in-memory exporter (a span processor that hands
each ended span over at once): every step then records a ``chat`` and an ``execute_tool`` span under the turn's
``invoke_agent``. ``off`` installs nothing, as loopd runs without ``OTEL_EXPORTER_OTLP_ENDPOINT``.

Both modes run a full collection just before the window: otherwise whether the collector's occasional full pass
(30–40 ms with ~2,000 live records, and more often with the exporter keeping every span) lands in the window or
just outside it decided the ratio. The young collections the steps cause still fall in the window and count.
With tracing on, the exporter's spans are dropped after each session (a real exporter sends them on).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx2

from benchmarks._peer_loopd import MODEL, final_reply, tool_reply
from loopd.harness import (
    EchoTool,
    LoopDefinition,
    ModelRequest,
    Reply,
    Rig,
    ScriptedModel,
    SqliteJournal,
    Usage,
)
from loopd.harness.models import Model, OpenAICompatibleModel

PAYLOAD = "x" * 200
USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)


def _scripted(steps: int, enter: Callable[[], int]) -> ScriptedModel:
    def reply(request: ModelRequest) -> Reply:
        index = enter()
        if index < steps:
            return Reply(text="", tool_calls=[("echo", {"text": PAYLOAD})], usage=USAGE)
        return Reply(text="final", usage=USAGE)

    return ScriptedModel(reply)


def _transport(steps: int, enter: Callable[[], int]) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        index = enter()
        body = tool_reply(index) if index < steps else final_reply(index)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.MockTransport(handle)


async def run(steps: int, window: int, model_kind: str) -> float:
    """One session of ``steps`` tool steps; the mean ms per step over its last ``window`` steps."""
    stamps: list[float] = []

    def enter() -> int:
        """Called at each model call: the index of the call (= steps completed), stamped."""
        if len(stamps) == steps - window:
            gc.collect()  # both modes enter the window from the same collector state (see the module docstring)
        stamps.append(time.perf_counter())
        return len(stamps) - 1

    http: httpx2.AsyncClient | None = None
    model: Model
    if model_kind == "adapter":
        http = httpx2.AsyncClient(transport=_transport(steps, enter), timeout=60.0)
        model = OpenAICompatibleModel(MODEL, base_url="http://model.invalid/v1", api_key="bench", http_client=http)
    else:
        model = _scripted(steps, enter)
    with tempfile.TemporaryDirectory() as directory:
        journal = await SqliteJournal.open(Path(directory) / "j.db")
        loop = LoopDefinition(name="main", model=model, tools=(EchoTool(),), max_steps=steps + 1)
        try:
            session = await Rig(loops=[loop], journal=journal).start_session()
            await session.ask("go", timeout=3600)
            await session.shutdown()
        finally:
            if isinstance(model, OpenAICompatibleModel):
                await model.aclose()
            if http is not None:
                await http.aclose()
            await journal.aclose()
    if len(stamps) != steps + 1:
        raise SystemExit(f"the turn made {len(stamps)} model calls, expected {steps + 1}")
    # stamps[i] is the start of step i+1; a step runs from one model call to the next.
    return (stamps[steps] - stamps[steps - window]) / window * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--model", choices=["adapter", "scripted"], default="adapter")
    parser.add_argument("--sessions", type=int, default=1, help="sessions run one after the other in this process")
    args = parser.parse_args()
    recorded = None
    if args.mode == "on":
        from benchmarks._spans import MemorySpans

        recorded = MemorySpans()
    per_session: list[float] = []
    spans: list[int] = []
    for _ in range(args.sessions):
        per_session.append(asyncio.run(run(args.steps, min(args.window, args.steps), args.model)))
        spans.append(recorded.take() if recorded is not None else 0)
    result = {
        "per_step_ms": statistics.mean(per_session),
        "per_session_ms": per_session,
        "spans": spans[0],
        "spans_per_session": spans,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
