"""Issue 17's gaps: drift covers tool schemas and limits; ContextPressure once per crossing; a full lane's refusal
is journaled (`HustleRefused`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from loopd._infra.clock import SystemClock
from loopd.harness import (
    ConfigurationDriftError,
    EchoTool,
    LoopDefinition,
    MemoryJournal,
    Reply,
    Rig,
    ScriptedModel,
    Usage,
)
from loopd.harness.actors import HustleLanes, HustleQueueFullError, HustleResult
from loopd.harness.core import events as ev
from loopd.harness.core.compaction import context_pressure
from loopd.harness.core.config import decide_drift, limits_digest, tool_schemas_digest
from loopd.harness.core.hustles import LaneLimits
from loopd.harness.models import ToolSpec
from tests.support.waiting import eventually

from .helpers import journal_state

# --- drift: tool schemas and limits --------------------------------------------------------------------------------


class DescribedEcho(EchoTool):
    """The echo tool with another description (what the model is told changed, not the tool's name)."""

    @property
    def spec(self) -> ToolSpec:
        base = super().spec
        return ToolSpec(name=base.name, description="Echo, but described differently.", parameters=base.parameters)


def test_the_schema_and_limit_digests_see_what_names_do_not() -> None:
    echo = EchoTool().spec
    same = tool_schemas_digest([(echo.name, echo.description, echo.parameters)])
    assert same == tool_schemas_digest([(echo.name, echo.description, dict(echo.parameters))])
    described = DescribedEcho().spec
    assert same != tool_schemas_digest([(described.name, described.description, described.parameters)])
    assert limits_digest({"b": 2, "a": None}) == "a=None;b=2"


def test_aspects_a_journal_predates_are_adopted_without_asking() -> None:
    old = {"loop:main:model": "m", "loop:main:tools": "echo"}
    current = {**old, "loop:main:tool-schemas": "sha256:x", "loop:main:limits": "max_steps=25"}
    adopted = decide_drift("s", old, current, "refuse", now=1.0)
    assert adopted is not None and adopted.changes == () and adopted.fingerprint == current
    with pytest.raises(ConfigurationDriftError) as refused:  # a real change is still asked about (only it)
        decide_drift("s", old, {**current, "loop:main:model": "n"}, "refuse", now=1.0)
    assert [c.aspect for c in refused.value.changes] == ["loop:main:model"]
    # Once recorded, a changed schema or limit is drift like any other aspect.
    with pytest.raises(ConfigurationDriftError):
        decide_drift("s", current, {**current, "loop:main:limits": "max_steps=5"}, "refuse", now=1.0)


async def test_a_restore_under_changed_tool_schemas_or_limits_is_drift() -> None:
    journal = MemoryJournal()
    loop = LoopDefinition(name="main", model=ScriptedModel([], default=Reply(text="ok")), tools=(EchoTool(),))
    rig = Rig(loops=[loop], journal=journal, on_drift="refuse")
    session = await rig.start_session()
    await session.ask("hi", timeout=10)
    await session.shutdown()
    described = replace(rig, loops=[replace(loop, tools=(DescribedEcho(),))])
    with pytest.raises(ConfigurationDriftError) as schemas:
        await described.restore_session(session.id)
    assert {c.aspect for c in schemas.value.changes} == {"loop:main:tool-schemas"}  # same tool names
    limited = replace(rig, loops=[replace(loop, max_steps=3)])
    with pytest.raises(ConfigurationDriftError) as limits:
        await limited.restore_session(session.id)
    (change,) = limits.value.changes
    assert change.aspect == "loop:main:limits" and "max_steps=25" in change.before and "max_steps=3" in change.after
    adopted = await replace(limited, on_drift="adopt").restore_session(session.id)
    try:
        assert adopted.state.fingerprint == limited.fingerprint()
    finally:
        await adopted.shutdown()


def test_a_rigs_fingerprint_is_computed_once_and_each_caller_gets_its_own_copy() -> None:
    loop = LoopDefinition(name="main", model=ScriptedModel([], default=Reply(text="ok")), tools=(EchoTool(),))
    rig = Rig(loops=[loop], journal=MemoryJournal())
    first = rig.fingerprint()
    first["loop:main:model"] = "changed by a caller"
    assert rig.fingerprint()["loop:main:model"] != "changed by a caller"
    assert rig.fingerprint() == rig.fingerprint() and rig.fingerprint() is not rig.fingerprint()
    assert (
        replace(rig, loops=[replace(loop, max_steps=3)]).fingerprint()["loop:main:limits"]
        != (rig.fingerprint()["loop:main:limits"])
    )


# --- context pressure: once per crossing ---------------------------------------------------------------------------


def test_pressure_is_reported_when_the_threshold_is_crossed_not_after() -> None:
    def measured(tokens: int) -> ev.ContextMeasured:
        return ev.ContextMeasured(loop="main", turn_id="t", step=1, tokens=tokens, window=1000, at=0.0)

    assert context_pressure(measured(850), limit=1000, pressure_at=0.8, previous_tokens=700) is not None
    assert context_pressure(measured(900), limit=1000, pressure_at=0.8, previous_tokens=850) is None  # still past
    assert context_pressure(measured(850), limit=1000, pressure_at=0.8, previous_tokens=300) is not None  # again
    assert context_pressure(measured(850), limit=1000, pressure_at=0.8) is not None  # the first measurement


async def test_a_loop_reports_pressure_once_per_crossing() -> None:
    usage = [900, 950, 300, 880, 100]  # crosses, stays past, falls (a compaction), crosses again, falls
    model = ScriptedModel([Reply(text=str(t), usage=Usage(input_tokens=t)) for t in usage])
    loop = LoopDefinition(name="main", model=model, context_window=1000)
    session = await Rig(loops=[loop], journal=MemoryJournal()).start_session()
    try:
        sub = session.subscribe(kinds={"context_measured", "context_pressure"})
        seen: list[tuple[str, int]] = []
        for i in range(len(usage)):
            await session.ask(f"q{i}", timeout=10)
        while sum(1 for kind, _ in seen if kind == "context_measured") < len(usage):
            item = await asyncio.wait_for(anext(sub), 10)
            event: Any = item.event
            seen.append((event.kind, event.tokens))
        # The last measurement is below the threshold, so a pressure of the one before it came already.
        pressures = [tokens for kind, tokens in seen if kind == "context_pressure"]
        assert pressures == [900, 880]
    finally:
        await session.shutdown()


# --- a full lane's refusal is journaled ----------------------------------------------------------------------------


async def test_a_full_lane_records_its_refusal() -> None:
    recorded: list[object] = []

    async def record(event: object) -> None:
        recorded.append(event)

    lanes = HustleLanes(record, clock=SystemClock(), limits={"background": LaneLimits(concurrency=1, queue=0)})
    release = asyncio.Event()

    async def held() -> HustleResult:
        await release.wait()
        return HustleResult(value="x")

    lanes.submit("title", "background", held, on_end=lambda *_: None, loop="main")
    with pytest.raises(HustleQueueFullError):
        lanes.submit("title", "background", held, on_end=lambda *_: None, loop="main")
    refused = await eventually(lambda: next((e for e in recorded if isinstance(e, ev.HustleRefused)), None))
    assert (refused.name, refused.lane, refused.for_loop) == ("title", "background", "main")
    assert "lane is full" in refused.reason
    release.set()
    await eventually(lambda: any(isinstance(e, ev.HustleCompleted) for e in recorded))
    assert len(lanes.infos) == 0  # the refusal opened nothing
    await lanes.aclose()


async def test_a_sessions_refused_hustle_is_in_its_journal() -> None:
    journal = MemoryJournal()
    loop = LoopDefinition(name="main", model=ScriptedModel([], default=Reply(text="ok")))
    rig = Rig(loops=[loop], journal=journal, lanes={"background": LaneLimits(concurrency=1, queue=0)})
    session = await rig.start_session()
    release = asyncio.Event()

    async def held() -> HustleResult:
        await release.wait()
        return HustleResult()

    try:
        session.hustles.submit("summary", "background", held, on_end=lambda *_: None)
        with pytest.raises(HustleQueueFullError):
            session.hustles.submit("summary", "background", held, on_end=lambda *_: None)

        async def refused_kinds() -> bool:
            return "hustle_refused" in [r.kind for r in await journal.read(session.id)]

        await eventually(refused_kinds)
        rebuilt = await journal_state(journal, session.id)
        assert dict(rebuilt.hustles) == dict(session.state.hustles) and len(rebuilt.hustles) == 1
        assert rebuilt.last_seq == session.last_seq
        release.set()
    finally:
        await session.shutdown()
