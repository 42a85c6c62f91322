"""Restore's fast fold is the same function as applying `apply` event by event.

`fold` keeps one `LoopState` per loop and builds the `SessionState` once; `apply_loop` builds its new states with
direct constructor calls; `Usage.__add__` skips validation. Each shortcut is checked here against the plain
definition, on generated journals that mix loops, session-scoped events and every loop event kind.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.harness import EchoTool, LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel, Usage
from loopd.harness.core import apply, fold
from loopd.harness.core import events as ev
from loopd.harness.core._values import ZERO_USAGE, ToolCall, ToolOutcome
from loopd.harness.core.state import LoopState, SessionState, TurnState

Stored = ev.SessionEvent | ev.LoopEvent

usages = st.builds(
    Usage,
    input_tokens=st.integers(0, 500),
    output_tokens=st.integers(0, 500),
    cached_tokens=st.integers(0, 50),
    cost_usd=st.sampled_from([0.0, 0.25, 0.001]),
    calls=st.integers(0, 2),
)


@st.composite
def journals(draw: st.DrawFn) -> list[Stored]:
    """A plausible journal: loops in and out of turns, queued inputs, gates, compaction, agents, restores."""
    loops = ["main", "side"]
    out: list[Stored] = [ev.SessionStarted(session_id="s", rig="r", loops=tuple(loops), at=0.0)]
    open_turns: dict[str, tuple[str, int, int]] = {}  # loop -> (turn id, step, tool calls still open)
    counter = 0
    for _ in range(draw(st.integers(0, 60))):
        counter += 1
        if draw(st.integers(0, 9)) == 0:
            choices = ["agent", "stop_agent", "restored", "stopped", "stray", "active", "adopted", "mode", "model"]
            choices.append("hustle")
            choices.append("foreign")
            match draw(st.sampled_from(choices)):
                case "agent":
                    name = f"agent-{counter}"
                    loops.append(name)
                    out.append(ev.AgentStarted(agent=name, definition="d", parent="main", depth=1, at=0.0))
                case "stop_agent":
                    out.append(ev.AgentStopped(agent=draw(st.sampled_from(loops)), reason="done", at=0.0))
                case "restored":
                    out.append(ev.SessionRestored(from_seq=len(out), mode="interrupt", at=0.0))
                case "hustle":  # background runs open and close at any point, in or out of turns
                    hid = f"h{draw(st.integers(0, 3))}"
                    end = draw(st.sampled_from(["start", "completed", "failed"]))
                    if end == "start":
                        out.append(
                            ev.HustleStarted(
                                hustle_id=hid, name="compaction", lane="background", for_loop="main", params={}, at=0.0
                            )
                        )
                    elif end == "completed":
                        out.append(ev.HustleCompleted(hustle_id=hid, usage=draw(usages), at=0.0))
                    else:
                        out.append(ev.HustleFailed(hustle_id=hid, error_type="E", message="m", at=0.0))
                case "stopped":
                    out.append(ev.SessionStopped(reason="bye", at=0.0))
                case "active":
                    out.append(ev.ActiveLoopChanged(active=draw(st.sampled_from(loops)), previous=None, at=0.0))
                case "adopted":
                    change = ev.ConfigChange(aspect="loop:main:model", before="a", after="b")
                    out.append(ev.ConfigurationAdopted(changes=(change,), fingerprint={"loop:main:model": "b"}, at=0.0))
                case "mode":  # in or out of a turn: the running step keeps its mode
                    mode = draw(st.sampled_from(["plan", "build"]))
                    out.append(ev.LoopModeChanged(loop=draw(st.sampled_from(loops)), mode=mode, at=0.0))
                case "model":
                    out.append(ev.LoopInferenceChanged(loop=draw(st.sampled_from(loops)), model=f"m{counter}", at=0.0))
                case "foreign":  # a foreign loop's CLI names its session, in or out of a turn
                    sid = f"f{draw(st.integers(0, 2))}"
                    loop = draw(st.sampled_from(loops))
                    out.append(ev.ForeignSessionBound(loop=loop, engine="codex", foreign_session_id=sid, at=0.0))
                    out.append(ev.ForeignToolUsed(loop=loop, turn_id="t", call_id="c", name="command", at=0.0))
                case _:  # a loop-scoped event for a loop nobody announced
                    loop = f"stray-{counter}"
                    loops.append(loop)
                    out.append(ev.InputQueued(loop=loop, command_id=f"c{counter}", text="queued"))
            continue
        loop = draw(st.sampled_from(loops))
        turn = open_turns.get(loop)
        if turn is None:
            kind = draw(st.sampled_from(["start", "queue", "cancel", "reject"]))
            if kind == "start":
                inputs = tuple(ev.QueuedInput(command_id=f"c{counter}-{i}", text=f"hi {i}") for i in range(2))
                out.append(ev.TurnStarted(loop=loop, turn_id=f"t{counter}", inputs=inputs, at=0.0))
                open_turns[loop] = (f"t{counter}", 1, 0)
            elif kind == "queue":
                out.append(ev.InputQueued(loop=loop, command_id=f"c{counter}", text="later"))
            elif kind == "cancel":
                out.append(ev.InputCancelled(loop=loop, command_id=f"c{counter - 1}", reason="nope"))
            else:
                out.append(ev.InputRejected(loop=loop, command_id=f"c{counter}", reason="full"))
            continue
        turn_id, step, open_calls = turn
        kinds = ["tool", "gate", "ask"] if open_calls else ["reply", "done", "compact", "fold", "queue", "step_done"]
        kinds += ["failed", "interrupted"]
        kind = draw(st.sampled_from(kinds))
        if kind == "reply":
            n = draw(st.integers(1, 3))
            calls = tuple(ToolCall(id=f"{turn_id}-{step}-{i}", name="echo", arguments={"i": i}) for i in range(n))
            usage = draw(usages)
            window = draw(st.sampled_from([None, 1000]))
            out.append(ev.ContextMeasured(loop=loop, turn_id=turn_id, step=step, tokens=counter, window=window, at=0.0))
            out.append(ev.ModelReplied(loop=loop, turn_id=turn_id, step=step, text="", tool_calls=calls, usage=usage))
            open_turns[loop] = (turn_id, step, n)
        elif kind == "tool":
            outcome = ToolOutcome(call_id=f"{turn_id}-{step}-{open_calls}", name="echo", status="ok", output="o")
            out.append(ev.ToolCompleted(loop=loop, turn_id=turn_id, step=step, outcome=outcome))
            open_turns[loop] = (turn_id, step, open_calls - 1)
        elif kind == "ask":  # a question for one of the open calls; its ToolCompleted closes it
            request_id = f"{turn_id}-{step}-{open_calls}"
            out.append(
                ev.UserInputRequested(
                    loop=loop,
                    turn_id=turn_id,
                    step=step,
                    request_id=request_id,
                    question="which?",
                    choices=("a", "b"),
                    deadline=9.0,
                    at=0.0,
                )
            )
        elif kind == "gate":
            gate_id = f"g{counter}"
            out.append(
                ev.GateOpened(
                    loop=loop,
                    turn_id=turn_id,
                    step=step,
                    gate_id=gate_id,
                    call_ids=("x",),
                    prompt={"q": 1},
                    deadline=9.0,
                    at=0.0,
                )
            )
            out.append(
                ev.GateResolved(
                    loop=loop, turn_id=turn_id, step=step, gate_id=gate_id, answer="approve", granted=True, at=0.0
                )
            )
        elif kind == "step_done":
            out.append(ev.StepDone(loop=loop, turn_id=turn_id, step=step, usage=draw(usages)))
            open_turns[loop] = (turn_id, step + 1, 0)
        elif kind == "compact":
            out.append(
                ev.HistoryCompacted(
                    loop=loop,
                    turn_id=turn_id,
                    step=step,
                    summary="short",
                    replaced=draw(st.integers(0, 3)),
                    usage=draw(usages),
                    at=0.0,
                )
            )
        elif kind == "fold":
            inputs = (ev.QueuedInput(command_id=f"c{counter}", text="more"),)
            out.append(ev.InputsFolded(loop=loop, turn_id=turn_id, inputs=inputs))
        elif kind == "queue":
            out.append(ev.InputQueued(loop=loop, command_id=f"c{counter}", text="waiting"))
        elif kind == "done":
            out.append(
                ev.TurnDone(
                    loop=loop,
                    turn_id=turn_id,
                    step=step,
                    text="answer",
                    step_usage=draw(usages),
                    usage=ZERO_USAGE,
                    at=0.0,
                )
            )
            del open_turns[loop]
        else:
            outcomes = tuple(
                ToolOutcome(call_id=f"{turn_id}-open-{i}", name="echo", status="interrupted", output="")
                for i in range(open_calls)
            )
            if kind == "failed":
                out.append(
                    ev.TurnFailed(
                        loop=loop,
                        turn_id=turn_id,
                        error_type="E",
                        message="m",
                        usage=ZERO_USAGE,
                        outcomes=outcomes,
                        at=0.0,
                    )
                )
            else:
                out.append(
                    ev.TurnInterrupted(
                        loop=loop, turn_id=turn_id, reason="stop", usage=ZERO_USAGE, outcomes=outcomes, at=0.0
                    )
                )
            del open_turns[loop]
    return out


def one_by_one(pairs: list[tuple[int, Stored]], state: SessionState | None = None) -> SessionState:
    start = state if state is not None else SessionState(session_id="")
    return functools.reduce(lambda s, p: apply(s, p[1], p[0]), pairs, start)


@settings(max_examples=150, deadline=None)
@given(events=journals(), cut=st.integers(0, 80))
def test_fold_is_apply_event_by_event(events: list[Stored], cut: int) -> None:
    pairs = list(enumerate(events, start=1))
    expected = one_by_one(pairs)
    folded = fold(pairs)
    assert folded == expected
    assert folded.last_seq == len(events)
    assert dict(folded.loops) == dict(expected.loops)
    # Folding on from a state (what a resumed fold does) is the same as folding everything at once.
    assert fold(pairs[cut:], fold(pairs[:cut])) == expected
    assert fold(pairs[cut:], one_by_one(pairs[:cut])) == expected


def test_apply_without_a_seq_keeps_the_last_seq() -> None:
    started = apply(SessionState(session_id=""), ev.SessionStarted(session_id="s", rig="r", loops=("a",), at=0.0))
    assert started.last_seq == 0
    state = apply(started, ev.InputQueued(loop="a", command_id="c", text="t"), 7)
    assert state.last_seq == 7
    assert apply(state, ev.InputRejected(loop="a", command_id="d", reason="r")).last_seq == 7
    assert apply(state, ev.SessionStopped(reason="r", at=0.0)).last_seq == 7
    assert fold([]) == SessionState(session_id="")


def test_the_direct_constructors_in_apply_know_every_field() -> None:
    # apply_loop writes LoopState and TurnState out field by field; a new field must be added there too
    # (and then here). Otherwise the frequent events would silently reset it to its default.
    assert [f.name for f in fields(LoopState)] == [
        "name",
        "history",
        "turn",
        "queued",
        "turns",
        "usage",
        "last_reply",
        "context_tokens",
        "context_mark",
        "mode",
        "model",
        "measured_tokens",
        "context_window",
        "foreign_session_id",
    ]
    assert [f.name for f in fields(TurnState)] == [
        "turn_id",
        "step",
        "phase",
        "usage",
        "step_usage",
        "calls",
        "outcomes",
        "gate",
        "mode",
        "asks",
    ]


@given(a=usages, b=usages)
def test_a_sum_of_usages_is_the_validated_sum(a: Usage, b: Usage) -> None:
    total = a + b
    validated = Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
        cost_usd=a.cost_usd + b.cost_usd,
        calls=a.calls + b.calls,
    )
    assert total == validated and hash(total) == hash(validated)
    assert type(total) is Usage
    assert total.model_dump() == validated.model_dump()
    assert total.model_fields_set == validated.model_fields_set
    # Everything pydantic keeps on an instance matches a validated one (this fails if pydantic adds state).
    assert total.__pydantic_extra__ == validated.__pydantic_extra__
    assert total.__pydantic_private__ == validated.__pydantic_private__
    assert Usage.model_validate_json(total.model_dump_json()) == validated
    assert (ZERO_USAGE + a) is a and (a + ZERO_USAGE) is a


async def test_a_restore_puts_the_collector_back_as_it_found_it() -> None:
    journal = MemoryJournal()
    model = ScriptedModel([], default=Reply(text="done"))
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal)
    session = await rig.start_session()
    await session.ask("hello", timeout=10)
    session.abort()
    seen: list[bool] = []
    for enabled in (True, False):
        if not enabled:
            gc.disable()
        try:
            restored = await rig.restore_session(session.id)
            seen.append(gc.isenabled())
        finally:
            gc.enable()
        restored.abort()
        assert restored.state.loops["main"].last_reply == "done"
    assert seen == [True, False]
