"""The workload on the loopd harness: one session, one turn, SqliteJournal on a file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from benchmarks._workload import (
    FINAL_TEXT,
    TOOL_ARGUMENTS,
    USER_TEXT,
    GcTime,
    PeerRun,
    StepClock,
    count_rows,
    directory_bytes,
    finish,
)
from loopd.harness import EchoTool, LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, Usage
from loopd.harness.core.events import TurnDone

USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)
DB = "loopd.db"


def fake_model(clock: StepClock, probe: list[int] | None, path: Path) -> ScriptedModel:
    tool_reply = Reply(text="", tool_calls=[("echo", TOOL_ARGUMENTS)], usage=USAGE)
    final_reply = Reply(text=FINAL_TEXT, usage=USAGE)

    def reply(_request: ModelRequest) -> Reply:
        index, started = clock.enter()
        if probe is not None:
            probe.append(count_rows(path, "SELECT count(*) FROM journal_records WHERE kind = 'step_done'"))
        chosen = tool_reply if clock.wants_tool(index) else final_reply
        clock.leave(started)
        return chosen

    return ScriptedModel(reply)


async def run(
    steps: int, directory: Path, *, probe: bool = False, synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
) -> PeerRun:
    path = directory / DB
    clock = StepClock(steps)
    durable_rows: list[int] | None = [] if probe else None
    journal = await SqliteJournal.open(path, synchronous=synchronous)
    rig = Rig(
        loops=[
            LoopDefinition(
                name="main", model=fake_model(clock, durable_rows, path), tools=(EchoTool(),), max_steps=steps + 1
            )
        ],
        journal=journal,
    )
    session = await rig.start_session()
    with GcTime().measuring() as gc_time:
        started = time.perf_counter()
        end = await session.ask(USER_TEXT, timeout=3600)
        wall = time.perf_counter() - started
    await session.shutdown()
    await journal.aclose()
    disk = directory_bytes(directory, DB)
    problem = "" if isinstance(end, TurnDone) else f"turn ended with {end.kind}"
    persisted = {
        "step_done records": count_rows(path, "SELECT count(*) FROM journal_records WHERE kind = 'step_done'"),
        "tool_completed records": count_rows(
            path, "SELECT count(*) FROM journal_records WHERE kind = 'tool_completed'"
        ),
        "records": count_rows(path, "SELECT count(*) FROM journal_records"),
    }
    if persisted["step_done records"] != steps or persisted["tool_completed records"] != steps:
        problem = problem or f"journal holds {persisted}, expected {steps} steps"
    peer = "loopd" if synchronous == "NORMAL" else "loopd (synchronous=FULL)"
    return finish(peer, clock, wall, disk, persisted, problem, durable_rows or [], gc_time)
