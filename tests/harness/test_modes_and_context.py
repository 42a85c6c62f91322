"""Primers, loop modes, the active loop, model switching, configuration drift on restore, context measurement.

Pure decisions first (decide / decide_drift / context_pressure), then the runtime, then restores after a crash.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from loopd.harness import (
    BUILD,
    PLAN,
    ConfigurationDriftError,
    EchoTool,
    EffectKind,
    Idempotency,
    Journal,
    LoopDefinition,
    LoopMode,
    ModelRequest,
    Primer,
    Reply,
    Rig,
    ScriptedModel,
    ToolSpec,
    UnknownSettingError,
    Usage,
)
from loopd.harness.core import History
from loopd.harness.core import events as ev
from loopd.harness.core._values import ToolCall
from loopd.harness.core.apply import apply_loop
from loopd.harness.core.commands import ChangeLoopInference, SetLoopMode, UserInput
from loopd.harness.core.compaction import compact_threshold, context_pressure, pressure_limit
from loopd.harness.core.config import compose_prompt, decide_active_loop, decide_drift, diff_fingerprints
from loopd.harness.core.decide import LoopConfig, decide
from loopd.harness.core.inputs import CallModel, ModelCompleted
from loopd.harness.core.state import LoopState
from loopd.harness.tools import PreparedCall, ToolContext, ToolResult
from tests.support.waiting import eventually

from .helpers import journal_state

CONFIG = LoopConfig(name="main", modes=("plan", "build"), default_mode="plan", model="small", context_window=1000)


def started(config: LoopConfig = CONFIG) -> LoopState:
    d = decide(LoopState(name="main"), UserInput(command_id="c1", text="hi"), config=config, now=1.0)
    state = LoopState(name="main")
    for e in d.events:
        state = apply_loop(state, e)
    return state


def fold_decision(state: LoopState, events: tuple[ev.LoopEvent, ...]) -> LoopState:
    for e in events:
        state = apply_loop(state, e)
    return state


# --- pure decisions --------------------------------------------------------------------------------------------


def test_a_mode_change_is_decided_once_and_applies_from_the_next_step() -> None:
    state = started()
    assert state.turn is not None and state.turn.mode is None  # the definition's default ("plan")
    d = decide(state, SetLoopMode(command_id="m", mode="build"), config=CONFIG, now=2.0)
    assert d.events == (ev.LoopModeChanged(loop="main", mode="build", previous="plan", at=2.0),)
    assert d.effects == ()
    state = fold_decision(state, d.events)
    assert state.mode == "build"
    assert state.turn is not None and state.turn.mode is None  # the running step keeps its mode
    # The same mode again, or an undeclared one, decides nothing.
    assert decide(state, SetLoopMode(command_id="m2", mode="build"), config=CONFIG, now=3.0).events == ()
    assert decide(state, SetLoopMode(command_id="m3", mode="nope"), config=CONFIG, now=3.0).events == ()
    # The model asks for a tool, the batch completes: the next step runs in the new mode.
    call = ToolCall(id="t1", name="echo", arguments={})
    reply = ModelCompleted(turn_id="main/1", step=1, text="", tool_calls=(call,), usage=Usage(input_tokens=10))
    state = fold_decision(state, decide(state, reply, config=CONFIG, now=4.0).events)
    assert state.turn is not None and state.turn.mode is None
    state = apply_loop(state, ev.StepDone(loop="main", turn_id="main/1", step=1, usage=Usage()))
    assert state.turn is not None and state.turn.mode == "build"


def test_a_model_change_is_decided_against_the_allowed_models() -> None:
    state = started()
    d = decide(state, ChangeLoopInference(command_id="i", model="large"), config=CONFIG, now=2.0)
    assert d.events == (ev.LoopInferenceChanged(loop="main", model="large", previous="small", at=2.0),)
    state = fold_decision(state, d.events)
    assert CONFIG.model_of(state) == "large"
    assert decide(state, ChangeLoopInference(command_id="j", model="large"), config=CONFIG, now=3.0).events == ()
    limited = replace(CONFIG, models=("small", "large"))
    assert decide(state, ChangeLoopInference(command_id="k", model="huge"), config=limited, now=3.0).events == ()


def test_every_model_reply_is_measured_before_it_is_recorded() -> None:
    state = started()
    usage = Usage(input_tokens=700, output_tokens=150)
    d = decide(state, ModelCompleted("main/1", 1, "done", (), usage), config=CONFIG, now=5.0)
    assert [type(e) for e in d.events] == [ev.ContextMeasured, ev.TurnDone]
    measured = d.events[0]
    assert isinstance(measured, ev.ContextMeasured)
    assert (measured.tokens, measured.window, measured.step) == (850, 1000, 1)
    after = fold_decision(state, d.events)
    assert (after.measured_tokens, after.context_window) == (850, 1000)
    # A provider that reports no usage: the estimate of the history and the reply.
    silent = decide(state, ModelCompleted("main/1", 1, "x" * 400, (), Usage()), config=CONFIG, now=5.0)
    estimated = silent.events[0]
    assert isinstance(estimated, ev.ContextMeasured) and estimated.tokens >= 100


def test_context_pressure_is_past_a_share_of_the_limit() -> None:
    measured = ev.ContextMeasured(loop="main", turn_id="t", step=1, tokens=850, window=1000, at=0.0)
    assert (
        pressure_limit(None, 1000) == 1000 and pressure_limit(500, None) == 500 and pressure_limit(None, None) is None
    )
    pressure = context_pressure(measured, limit=1000, pressure_at=0.8)
    assert pressure == ev.ContextPressure(loop="main", turn_id="t", tokens=850, limit=1000, ratio=0.85)
    assert context_pressure(measured, limit=1000, pressure_at=0.9) is None
    assert context_pressure(measured, limit=None, pressure_at=0.1) is None


def test_compaction_uses_the_context_window_when_no_threshold_is_set() -> None:
    assert compact_threshold(None, None) is None
    assert compact_threshold(300, 1000) == 300
    assert compact_threshold(None, 1000) == 850
    config = LoopConfig(name="main", context_window=100, compact_keep_recent=1)
    state = LoopState(name="main")
    for i in range(4):  # a long history measured at 95 tokens of a 100-token window
        started = decide(state, UserInput(command_id=f"c{i}", text="x" * 40), config=config, now=0)
        state = fold_decision(state, started.events)
        reply = ModelCompleted(f"main/{i + 1}", 1, "y" * 40, (), Usage(input_tokens=90, output_tokens=5))
        state = fold_decision(state, decide(state, reply, config=config, now=0).events)
    d = decide(state, UserInput(command_id="last", text="more"), config=config, now=0)
    assert [type(e).__name__ for e in d.effects] == ["Compact"]
    unbounded_config = replace(config, context_window=None)
    unbounded = decide(state, UserInput(command_id="last", text="more"), config=unbounded_config, now=0)
    assert [type(e) for e in unbounded.effects] == [CallModel]


def test_a_model_call_carries_the_loops_history_itself_not_a_copy() -> None:
    """`CallModel` gets the state's `History` (immutable; equal to the tuple of its messages): a step no longer
    copies the whole history, and the model's encoder knows an extension of the last one in O(1)."""
    config = LoopConfig(name="main")
    state = LoopState(name="main")
    started = decide(state, UserInput(command_id="c1", text="hello"), config=config, now=0)
    state = fold_decision(state, started.events)
    (effect,) = [e for e in started.effects if isinstance(e, CallModel)]
    assert isinstance(effect.messages, History)
    assert effect.messages == state.history == tuple(effect.messages)  # equal to its tuple, and to the fold's


def test_the_active_loop_decision() -> None:
    assert decide_active_loop("main", "main", now=1.0) is None
    assert decide_active_loop("main", "side", now=1.0) == ev.ActiveLoopChanged(active="side", previous="main", at=1.0)


def test_drift_is_adopted_refused_or_asked() -> None:
    recorded = {"loop:main:model": "small", "loop:main:tools": "echo"}
    current = {"loop:main:model": "large", "loop:main:tools": "echo", "loop:main:modes": "plan,build"}
    changes = diff_fingerprints(recorded, current)
    assert changes == (
        ev.ConfigChange(aspect="loop:main:model", before="small", after="large"),
        ev.ConfigChange(aspect="loop:main:modes", before="", after="plan,build"),
    )
    assert decide_drift("s", recorded, recorded, "refuse", now=1.0) is None
    adopted = decide_drift("s", recorded, current, "adopt", now=1.0)
    assert adopted == ev.ConfigurationAdopted(changes=changes, fingerprint=current, at=1.0)
    with pytest.raises(ConfigurationDriftError) as refused:
        decide_drift("s", recorded, current, "refuse", now=1.0)
    assert refused.value.changes == changes and "loop:main:model: small → large" in str(refused.value)
    only_models = lambda cs: all(c.aspect.endswith(":model") for c in cs)  # noqa: E731
    with pytest.raises(ConfigurationDriftError):
        decide_drift("s", recorded, current, only_models, now=1.0)
    assert decide_drift("s", recorded, {**recorded, "loop:main:model": "x"}, only_models, now=1.0) is not None
    # A journal from before fingerprints: adopted without asking, nothing listed as changed.
    legacy = decide_drift("s", {}, current, "refuse", now=1.0)
    assert legacy is not None and legacy.changes == () and legacy.fingerprint == current


def test_prompts_compose_base_primers_and_mode() -> None:
    assert compose_prompt(None, (), None) is None
    assert compose_prompt("base", ("p1", "p2"), PLAN) == f"base\n\np1\n\np2\n\n{PLAN.prompt}"
    assert compose_prompt(None, (), BUILD) is None
    assert PLAN.allows("read", EffectKind.READ) and not PLAN.allows("write", EffectKind.WRITE)
    assert not LoopMode(name="only", tools=("a",)).allows("b", EffectKind.NONE)
    with pytest.raises(ValueError):
        LoopMode(name="bad name")
    with pytest.raises(ValueError):
        Primer(name="empty", text="  ")


# --- runtime ---------------------------------------------------------------------------------------------------


class WriteTool:
    """A tool that changes something (effect WRITE, no permission needed); it waits for ``release`` if set."""

    def __init__(self) -> None:
        self.release: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.ran = 0

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name="write", description="Write something.", parameters={"type": "object"})

    @property
    def effect(self) -> EffectKind:
        return EffectKind.WRITE

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency.INHERENT

    def prepare(self, call: ToolCall) -> PreparedCall:
        return PreparedCall(call_id=call.id, tool="write", arguments=dict(call.arguments))

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        self.ran += 1
        return ToolResult(output="written")


def modal_rig(journal: Journal, model: ScriptedModel, tool: WriteTool, **rig: object) -> Rig:
    loop = LoopDefinition(
        name="main",
        model=model,
        model_name="small",
        tools=(EchoTool(), tool),
        system_prompt="You are a test.",
        primers=("house",),
        modes=(BUILD, PLAN),
        context_window=1000,
    )
    side = LoopDefinition(name="side", model=model, model_name="small")
    return Rig(
        loops=[loop, side],
        journal=journal,
        primers=(Primer(name="house", text="House rules."),),
        **rig,  # type: ignore[arg-type]
    )


async def test_a_mode_switch_mid_batch_waits_for_the_next_step(journal: Journal) -> None:
    tool = WriteTool()
    tool.release = asyncio.Event()
    model = ScriptedModel(
        [
            Reply(tool_calls=[("write", {})]),
            Reply(tool_calls=[("write", {}), ("echo", {"text": "ok"})]),
            Reply(text="planned"),
        ]
    )
    rig = modal_rig(journal, model, tool)
    session = await rig.start_session()
    await session.submit("go")
    await asyncio.wait_for(tool.started.wait(), 10)
    await session.set_loop_mode("plan")  # mid-batch: the running write goes on
    tool.release.set()
    await session.wait_idle(timeout=10)
    assert tool.ran == 1  # the first batch ran in build mode; the second write was withheld in plan mode
    first, second, third = model.requests
    assert [t.name for t in first.tools] == ["echo", "write"]
    assert first.system == "You are a test.\n\nHouse rules."
    assert [t.name for t in second.tools] == ["echo"]
    assert second.system is not None and second.system.endswith(PLAN.prompt)
    denied = [m for m in third.messages if m.role == "tool" and "not available in mode 'plan'" in m.content]
    assert len(denied) == 1
    state = session.state.loops["main"]
    assert state.mode == "plan" and state.last_reply == "planned"
    kinds = [r.kind for r in await journal.read(session.id)]
    assert kinds.index("loop_mode_changed") < kinds.index("step_done")
    assert kinds.count("context_measured") == 3
    rebuilt = await journal_state(journal, session.id)
    assert dict(rebuilt.loops) == dict(session.state.loops)
    await session.shutdown()


async def test_model_switch_active_loop_and_typed_refusals(journal: Journal) -> None:
    model = ScriptedModel([], default=Reply(text="ok"))
    session = await modal_rig(journal, model, WriteTool()).start_session()
    await session.change_loop_inference("large")
    await session.ask("one", timeout=10)
    assert model.requests[-1].model == "large"
    await session.set_active_loop("side")
    assert session.default_loop == "side"
    await session.ask("two", timeout=10)
    assert model.requests[-1].model == "small" and session.state.loops["side"].turns == 1
    with pytest.raises(UnknownSettingError, match="no mode 'fly'"):
        await session.set_loop_mode("fly", loop="main")
    with pytest.raises(UnknownSettingError, match="no mode"):
        await session.set_loop_mode("plan")  # the side loop declares no modes
    with pytest.raises(UnknownSettingError, match="no loop 'nope'"):
        await session.set_active_loop("nope")
    rebuilt = await journal_state(journal, session.id)
    assert rebuilt.active_loop == "side" == session.state.active_loop
    assert rebuilt.fingerprint == session.state.fingerprint != {}
    await session.shutdown()


async def test_context_pressure_is_published_past_the_threshold(journal: Journal) -> None:
    model = ScriptedModel([Reply(text="big", usage=Usage(input_tokens=900, output_tokens=10))])
    session = await modal_rig(journal, model, WriteTool()).start_session()
    sub = session.subscribe(kinds={"context_measured", "context_pressure"})
    await session.ask("hello", timeout=10)
    measured = await asyncio.wait_for(anext(sub), 10)
    pressure = await asyncio.wait_for(anext(sub), 10)
    assert isinstance(measured.event, ev.ContextMeasured) and measured.seq is not None
    assert isinstance(pressure.event, ev.ContextPressure) and pressure.seq is None
    assert (pressure.event.tokens, pressure.event.limit, pressure.event.ratio) == (910, 1000, 0.91)
    await session.shutdown()


# --- restore -------------------------------------------------------------------------------------------------


async def test_mode_model_and_active_loop_survive_a_crash(journal: Journal) -> None:
    tool = WriteTool()
    tool.release = asyncio.Event()
    model = ScriptedModel([Reply(tool_calls=[("write", {})])], default=Reply(text="after"))
    rig = modal_rig(journal, model, tool)
    session = await rig.start_session()
    await session.change_loop_inference("large")
    await session.submit("go")
    await asyncio.wait_for(tool.started.wait(), 10)
    await session.set_loop_mode("plan")  # queued like any command: durable once decided
    await eventually(lambda: session.state.loops["main"].mode == "plan", timeout=10)
    await session.set_active_loop("side")  # a session command: durable when the call returns
    session.abort()  # crash mid-batch
    restored = await rig.restore_session(session.id)
    main = restored.state.loops["main"]
    assert (main.mode, main.model, main.turn) == ("plan", "large", None)
    assert main.measured_tokens > 0 and main.context_window == 1000  # the measurement before the crash
    assert restored.default_loop == "side"
    await restored.ask("again", loop="main", timeout=10)
    last = model.requests[-1]
    assert last.model == "large" and [t.name for t in last.tools] == ["echo"]
    assert dict((await journal_state(journal, session.id)).loops) == dict(restored.state.loops)
    await restored.shutdown()


async def test_restore_under_a_changed_rig_adopts_or_refuses(journal: Journal) -> None:
    model = ScriptedModel([], default=Reply(text="ok"))
    rig = modal_rig(journal, model, WriteTool())
    session = await rig.start_session()
    await session.ask("hi", timeout=10)
    session.abort()  # the rig "closes abruptly"; it comes back with another model and without the write tool
    changed_loop = replace(rig.loops[0], model_name="large", tools=(EchoTool(),))
    refusing = replace(rig, loops=[changed_loop, rig.loops[1]], on_drift="refuse")
    with pytest.raises(ConfigurationDriftError) as refused:
        await refusing.restore_session(session.id)
    assert {c.aspect for c in refused.value.changes} == {"loop:main:model", "loop:main:tools", "loop:main:tool-schemas"}
    records = await journal.read(session.id)
    assert not any(r.kind == "configuration_adopted" for r in records)
    adopting = replace(refusing, on_drift="adopt")
    restored = await adopting.restore_session(session.id)  # the refused restore left the session restorable
    kinds = [r.kind for r in await journal.read(session.id)]
    assert kinds[-2:] == ["session_restored", "configuration_adopted"]
    state = await journal_state(journal, session.id)
    assert state.fingerprint == adopting.fingerprint() == restored.state.fingerprint
    await restored.ask("again", timeout=10)
    assert model.requests[-1].model == "large"
    await restored.shutdown()
    # Restoring again under the same rig: nothing changed, nothing recorded.
    again = await adopting.restore_session(session.id)
    assert [r.kind for r in await journal.read(session.id)].count("configuration_adopted") == 1
    await again.shutdown()


def test_rig_definition_checks_primers_and_modes() -> None:
    from loopd.harness import MemoryJournal

    model = ScriptedModel([])
    with pytest.raises(ValueError, match="primers the rig does not declare"):
        Rig(loops=[LoopDefinition(name="m", model=model, primers=("x",))], journal=MemoryJournal())
    with pytest.raises(ValueError, match="does not declare"):
        LoopDefinition(name="m", model=model, modes=(PLAN,), mode="build")
    with pytest.raises(ValueError, match="duplicate mode"):
        LoopDefinition(name="m", model=model, modes=(PLAN, PLAN))


async def test_a_declared_context_window_starts_compaction_and_survives_restore(journal: Journal) -> None:
    from loopd.harness.core.compaction import SUMMARIZER_PROMPT

    def script(request: ModelRequest) -> Reply:
        if request.system == SUMMARIZER_PROMPT:
            return Reply(text="the user said hello twice")
        return Reply(text="ok " * 10, usage=Usage(input_tokens=180, output_tokens=10))

    loop = LoopDefinition(name="main", model=ScriptedModel(script), context_window=200, compact_keep_recent=1)
    rig = Rig(loops=[loop], journal=journal)
    session = await rig.start_session()
    await session.ask("hello", timeout=10)
    session.abort()  # closed abruptly after one turn measured at 190 of 200 tokens
    restored = await rig.restore_session(session.id)
    assert restored.state.loops["main"].measured_tokens == 190
    await restored.ask("hello again", timeout=10)  # past 85 % of the window: the history is compacted
    await restored.wait_idle(timeout=10)
    kinds = [r.kind for r in await journal.read(session.id)]
    assert "history_compacted" in kinds
    assert dict((await journal_state(journal, session.id)).loops) == dict(restored.state.loops)
    await restored.shutdown()
