"""Harness core benchmarks: steps/s, durable appends/s vs raw sqlite3, restore time, bytes per step.

python -m benchmarks.harness_core [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

from benchmarks._common import median, print_table
from loopd.harness import EchoTool, LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, Usage
from loopd.harness.core import codec
from loopd.harness.core import events as ev
from loopd.harness.core._values import ToolCall, ToolOutcome
from loopd.harness.journal import NewRecord

USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)
PAYLOAD = "x" * 200  # ~200-byte messages


def stepper(steps: int) -> ScriptedModel:
    """Zero-latency model: ``steps`` tool-call steps, then a final answer."""

    def reply(request: ModelRequest) -> Reply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < steps:
            return Reply(text="", tool_calls=[("echo", {"text": PAYLOAD})], usage=USAGE)
        return Reply(text="final " + PAYLOAD, usage=USAGE)

    return ScriptedModel(reply)


async def steps_per_second(sessions: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        journal = await SqliteJournal.open(Path(d) / "j.db")
        rig = Rig(
            loops=[LoopDefinition(name="main", model=stepper(steps), tools=(EchoTool(),), max_steps=steps + 1)],
            journal=journal,
        )
        started = await asyncio.gather(*(rig.start_session() for _ in range(sessions)))
        t0 = time.perf_counter()
        await asyncio.gather(*(s.ask("go " + PAYLOAD, timeout=600) for s in started))
        wall = time.perf_counter() - t0
        await asyncio.gather(*(s.shutdown() for s in started))
        await journal.aclose()
    return sessions * steps / wall


async def journal_appends(sessions: int, per_session: int) -> float:
    record = NewRecord("tool_completed", 1, b'{"loop":"main","data":"' + PAYLOAD.encode() + b'"}', 0.0)
    with tempfile.TemporaryDirectory() as d:
        journal = await SqliteJournal.open(Path(d) / "j.db")
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(sessions)]

        async def drive(w: object) -> None:
            for _ in range(per_session):
                await w.append([record])  # type: ignore[attr-defined]

        t0 = time.perf_counter()
        await asyncio.gather(*(drive(w) for w in writers))
        wall = time.perf_counter() - t0
        await journal.aclose()
    return sessions * per_session / wall


def raw_sqlite_inserts(total: int, batch: int) -> float:
    data = b'{"loop":"main","data":"' + PAYLOAD.encode() + b'"}'
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(Path(d) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE r (sid INTEGER, seq INTEGER, kind TEXT, v INTEGER, at REAL, data BLOB, "
            "PRIMARY KEY (sid, seq)) WITHOUT ROWID"
        )
        t0 = time.perf_counter()
        seq = 0
        for _ in range(total // batch):
            rows = [(1, seq + i, "tool_completed", 1, 0.0, data) for i in range(batch)]
            seq += batch
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        wall = time.perf_counter() - t0
        conn.close()
    return total / wall


def synthetic_turn(turn: int, steps: int) -> list[ev.LoopEvent]:
    tid = f"main/{turn}"
    out: list[ev.LoopEvent] = [
        ev.TurnStarted(loop="main", turn_id=tid, inputs=(ev.QueuedInput(command_id=f"c{turn}", text=PAYLOAD),), at=0.0)
    ]
    for step in range(1, steps + 1):
        call = ToolCall(id=f"{tid}-{step}", name="echo", arguments={"text": PAYLOAD})
        out.append(ev.ModelReplied(loop="main", turn_id=tid, step=step, text="", tool_calls=(call,), usage=USAGE))
        out.append(
            ev.ToolCompleted(
                loop="main",
                turn_id=tid,
                step=step,
                outcome=ToolOutcome(call_id=call.id, name="echo", status="ok", output=PAYLOAD),
            )
        )
        out.append(ev.StepDone(loop="main", turn_id=tid, step=step, usage=USAGE))
    out.append(
        ev.TurnDone(loop="main", turn_id=tid, step=steps + 1, text=PAYLOAD, step_usage=USAGE, usage=USAGE, at=0.0)
    )
    return out


async def restore_time(n_events: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        journal = await SqliteJournal.open(Path(d) / "j.db")
        writer = await journal.create_session("big", at=0.0)
        first = ev.SessionStarted(session_id="big", rig="rig", loops=("main",), at=0.0)
        events: list[ev.SessionEvent | ev.LoopEvent] = [first]
        turn = 0
        while len(events) < n_events:
            turn += 1
            events.extend(synthetic_turn(turn, 5))
        events = events[:n_events]
        for i in range(0, len(events), 1000):
            await writer.append([NewRecord(*codec.encode(e), at=0.0) for e in events[i : i + 1000]])
        await writer.aclose()
        rig = Rig(loops=[LoopDefinition(name="main", model=stepper(0), tools=(EchoTool(),))], journal=journal)
        t0 = time.perf_counter()
        session = await rig.restore_session("big")
        wall = time.perf_counter() - t0
        await session.shutdown()
        await journal.aclose()
    return wall


async def bytes_per_step(steps: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "j.db"
        journal = await SqliteJournal.open(path)
        rig = Rig(
            loops=[LoopDefinition(name="main", model=stepper(steps), tools=(EchoTool(),), max_steps=steps + 1)],
            journal=journal,
        )
        session = await rig.start_session()
        await session.ask("go " + PAYLOAD, timeout=600)
        await session.shutdown()
        await journal.aclose()
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.close()
        size = sum(p.stat().st_size for p in Path(d).iterdir())
    raw = steps * 2 * len(PAYLOAD)  # tool-call argument + tool output per step
    return size / steps, raw


async def run(repeat: int) -> None:
    rows: list[list[object]] = []
    s1 = median([await steps_per_second(1, 500) for _ in range(repeat)])
    s100 = median([await steps_per_second(100, 50) for _ in range(repeat)])
    rows.append(["steps/s, 1 session (500 steps, 1 tool call each)", s1, f"{1000 / s1:.3f} ms/step"])
    rows.append(["steps/s, 100 concurrent sessions (50 steps each)", s100, f"{1000 / s100:.3f} ms/step"])
    raw = median([raw_sqlite_inserts(20_000, 100) for _ in range(repeat)])
    for n, per in ((1, 5000), (10, 1000), (100, 200)):
        ours = median([await journal_appends(n, per) for _ in range(repeat)])
        rows.append([f"durable appends/s, {n} session(s), 1 record/append", ours, f"{ours / raw:.2f}× raw sqlite3"])
    rows.append(["raw sqlite3 inserts/s, batches of 100", raw, "baseline"])
    r10k = median([await restore_time(10_000) for _ in range(repeat)])
    rows.append(["restore of a 10,000-event session (s)", r10k, f"{r10k * 1000:.1f} ms"])
    per_step, raw_bytes = await bytes_per_step(500)
    rows.append(
        ["bytes on disk per step (500 steps, 200-byte payloads)", per_step, f"{per_step * 500 / raw_bytes:.2f}× raw"]
    )
    print_table(f"harness core (median of {repeat})", ["measure", "value", "note"], rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.repeat))


if __name__ == "__main__":
    main()
