"""Child of `benchmarks.ledger_overhead`: ``--calls`` harness calls (default 1) through the Harness Engine, one after
the other, each on fresh databases (SQLite server database, SQLite journal; ``both``: that many of each mode, off
and on alternating, reported per mode), whose turn makes ``--steps`` tool steps, with the full ledger ``on`` (every
model call's request and reply stored as redacted, content-addressed artifacts) or ``off`` (the trail's usage facts
only, as before). Prints as JSON, each the mean over the calls: the wall and CPU time per step of the whole call
(from its start until the engine has applied its last update: the engine follows the harness asynchronously, so the
ledger's cost shows there) and the harness's own step time over the last ``--window`` steps (history near
``--steps``); and what the ledger stored for one call. ``--tracing on`` installs the OpenTelemetry SDK with the in-
memory exporter first (the server-side row of `benchmarks.tracing_overhead`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loopd._infra.clock import SystemClock
from loopd.harness import EchoTool, LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, Usage
from loopd.server.engine import BuiltinHarnessAdapter, CallRequest, HarnessEngine, PromptRecording, recording_rig
from loopd.server.ledger import Redactor, SqlLedgerStore
from loopd.server.storage import NewMessage, open_database
from loopd.server.streams import ConversationBus, empty_model, open_message

PAYLOAD = "x" * 200
USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)


async def run(mode: str, steps: int, window: int) -> dict[str, Any]:
    stamps: list[float] = []

    def reply(request: ModelRequest) -> Reply:
        stamps.append(time.perf_counter())
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < steps:
            return Reply(text="", tool_calls=[("echo", {"text": PAYLOAD})], usage=USAGE)
        return Reply(text="final", usage=USAGE)

    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        journal = await SqliteJournal.open(root / "journal.db")
        loop = LoopDefinition(name="main", model=ScriptedModel(reply), tools=(EchoTool(),), max_steps=steps + 1)
        rig = Rig(loops=[loop], journal=journal)
        clock = SystemClock()
        prompts = PromptRecording(clock, Redactor()) if mode == "on" else None
        adapter = BuiltinHarnessAdapter(recording_rig(rig) if prompts is not None else rig, prompts=prompts)
        async with open_database(root / "loopd.db") as db:
            engine = HarnessEngine(
                db,
                ledger=SqlLedgerStore(db),
                adapters={"builtin": adapter},
                bus=ConversationBus(),
                replica_id="bench",
                clock=clock,
                redactor=prompts.redactor if prompts is not None else None,
            )
            async with engine:
                async with db.transaction() as tx:
                    conversation = await tx.conversations.create(actor_kind="user", actor_key="bench")
                    message = await open_message(
                        tx,
                        NewMessage(
                            conversation_id=conversation.id,
                            kind="harness",
                            key="builtin",
                            purpose="response",
                            content=empty_model(),
                            task_id="task-bench",
                            status="streaming",
                        ),
                    )
                started, cpu = time.perf_counter(), time.process_time()
                call = await engine.start(
                    CallRequest("bench", "respond", "builtin", "go", message_id=message.id, asker="user:bench")
                )
                done = await engine.wait(call.id, 3600)
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu
                if done.phase != "succeeded":
                    raise SystemExit(f"the call ended {done.phase}: {done.error}")
            async with db.transaction(read_only=True) as tx:
                artifacts = await tx.fetch("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM ledger_artifacts")
                events = await tx.fetch("SELECT COUNT(*) FROM ledger_events")
        await journal.aclose()
    # stamps[i] is the start of step i+1; a step runs from one model call to the next.
    last, first = stamps[steps], stamps[steps - window]
    return {
        "per_step_ms": wall / steps * 1000.0,
        "cpu_per_step_ms": cpu / steps * 1000.0,
        "harness_step_ms": (last - first) / window * 1000.0,
        "artifacts": int(artifacts[0][0]),
        "artifact_bytes": int(artifacts[0][1]),
        "events": int(events[0][0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["on", "off", "both"], help="both: off and on calls alternate in this process")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument(
        "--tracing",
        choices=["on", "off"],
        default="off",
        help="on: the OpenTelemetry SDK's tracer provider with the in-memory exporter (`benchmarks.tracing_overhead`)",
    )
    parser.add_argument("--calls", type=int, default=1, help="calls run one after the other, each on fresh databases")
    args = parser.parse_args()
    recorded = None
    if args.tracing == "on":
        from benchmarks._spans import MemorySpans

        recorded = MemorySpans()
    modes = ("off", "on") if args.mode == "both" else (args.mode,)
    calls: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    spans: list[int] = []
    for index in range(max(1, args.calls)):
        for mode in modes if index % 2 == 0 else modes[::-1]:  # both: off/on, then on/off, …
            calls[mode].append(asyncio.run(run(mode, args.steps, min(args.window, args.steps))))
            spans.append(recorded.take() if recorded is not None else 0)
    results = {mode: _summary(done) for mode, done in calls.items()}
    if args.mode == "both":
        print(json.dumps({**results, "spans": spans[0]}))
    else:
        print(json.dumps({**results[args.mode], "spans": spans[0], "spans_per_call": spans}))


def _summary(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's calls: the timings their means, what one call stored, and each call's wall time per step."""
    timed = ("per_step_ms", "cpu_per_step_ms", "harness_step_ms")
    result = {**calls[-1], **{key: statistics.mean(call[key] for call in calls) for key in timed}}
    result["per_call_ms"] = [call["per_step_ms"] for call in calls]
    return result


if __name__ == "__main__":
    main()
