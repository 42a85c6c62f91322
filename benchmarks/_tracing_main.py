"""Child of `benchmarks.tracing_overhead`: one session of ``--steps`` tool steps, tracing ``on`` or ``off``; prints
the mean wall time per step over the last ``--window`` steps (history near ``--steps``) as JSON.

``on`` installs the OpenTelemetry SDK's tracer provider with the in-memory exporter (a span processor that hands
each ended span over at once): every step then records a ``chat`` and an ``execute_tool`` span under the turn's
``invoke_agent``. ``off`` installs nothing, as loopd runs without ``OTEL_EXPORTER_OTLP_ENDPOINT``.

Both modes run a full collection just before the window: otherwise whether the collector's occasional full pass
(30–40 ms with ~2,000 live records, and more often with the exporter keeping every span) lands in these 50 steps or
just outside them decided the ratio (it swung from 0.6 to 1.5 between runs). The young collections the steps cause
still fall in the window and count.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from pathlib import Path

from loopd.harness import EchoTool, LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, Usage

PAYLOAD = "x" * 200
USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)


async def run(steps: int, window: int) -> dict[str, float]:
    stamps: list[float] = []

    def reply(request: ModelRequest) -> Reply:
        if len(stamps) == steps - window:
            gc.collect()  # both modes enter the window from the same collector state (see the module docstring)
        stamps.append(time.perf_counter())
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < steps:
            return Reply(text="", tool_calls=[("echo", {"text": PAYLOAD})], usage=USAGE)
        return Reply(text="final", usage=USAGE)

    with tempfile.TemporaryDirectory() as directory:
        journal = await SqliteJournal.open(Path(directory) / "j.db")
        loop = LoopDefinition(name="main", model=ScriptedModel(reply), tools=(EchoTool(),), max_steps=steps + 1)
        session = await Rig(loops=[loop], journal=journal).start_session()
        await session.ask("go", timeout=3600)
        await session.shutdown()
        await journal.aclose()
    # stamps[i] is the start of step i+1; a step runs from one model call to the next.
    last = stamps[steps]
    first = stamps[steps - window]
    return {"per_step_ms": (last - first) / window * 1000.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["on", "off"])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--window", type=int, default=50)
    args = parser.parse_args()
    spans = 0
    if args.mode == "on":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    result = asyncio.run(run(args.steps, min(args.window, args.steps)))
    if args.mode == "on":
        spans = len(exporter.get_finished_spans())
    print(json.dumps({**result, "spans": spans}))


if __name__ == "__main__":
    main()
