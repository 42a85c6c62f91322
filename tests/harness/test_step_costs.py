"""What one step costs the harness does not grow with the history (the peers benchmark's per-step figures), and a
step makes no avoidable task.

`decide` folds every event it emits; the actor that commits them takes that fold (`Decision.state`) instead of
folding them a second time. A second fold would append to a `History` whose shared buffer the first fold had
already extended, so every step would copy the whole history (a cost growing with it).
"""

from __future__ import annotations

import asyncio

from loopd.harness import EchoTool, Journal, LoopDefinition, Reply, Rig, ScriptedModel
from loopd.harness.core import ToolCall
from loopd.harness.core.events import TurnDone
from loopd.harness.tools import PreparedCall

from .helpers import journal_state, same_loops

STEPS = 12


async def test_each_commit_is_folded_once_and_the_history_is_never_copied(journal: Journal) -> None:
    replies = [Reply(tool_calls=[("echo", {"text": f"t{i}"})]) for i in range(STEPS)] + [Reply(text="done")]
    model = ScriptedModel(replies)
    rig = Rig(
        loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),), max_steps=STEPS + 1)], journal=journal
    )
    session = await rig.start_session()
    actor = session.actors["main"]
    buffers: set[int] = set()
    sub = session.subscribe()

    async def watch() -> None:
        async for envelope in sub:
            buffers.add(id(actor.state.history._buf))  # which list holds the live history after each event
            if envelope.event.kind == "turn_done":
                return

    watcher = asyncio.create_task(watch())
    end = await session.ask("go", timeout=30)
    await asyncio.wait_for(watcher, 30)
    assert isinstance(end, TurnDone)
    assert len(actor.state.history) == 2 * STEPS + 2
    # Every commit of the turn took its decision's fold: none was folded again.
    assert actor.folds_skipped >= 2 * STEPS + 1
    # Each step's one allowed call ran in its gate batch's task (no task of its own per call).
    assert actor.inline_tool_runs == STEPS
    # One buffer from the turn's start to its end: no step copied the history.
    assert len(buffers) == 1, f"the history was copied {len(buffers) - 1} times"
    # And the live state is still exactly the fold of the journal.
    await session.wait_idle(timeout=30)
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()


async def test_a_state_changed_since_the_decision_is_folded_again(journal: Journal) -> None:
    """The shortcut holds only for the very state `decide` folded from; any other is folded event by event."""
    from loopd.harness.core.commands import UserInput
    from loopd.harness.core.decide import decide

    model = ScriptedModel([Reply(text="hi")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal)
    session = await rig.start_session()
    actor = session.actors["main"]
    decision = decide(actor.state, UserInput(command_id="c1", text="hello"), config=actor.config, now=0.0)
    assert decision.state is not None
    before = actor.folds_skipped
    actor._folded = (decision.events, decision.state, decision.state)  # recorded for another state than the live one
    actor.apply_committed(decision.events, list(range(1, len(decision.events) + 1)))
    actor._folded = None
    assert actor.folds_skipped == before
    assert actor.state == decision.state  # folded again, to the same result
    await session.shutdown()


async def test_a_batch_of_several_calls_still_runs_each_in_a_task_of_its_own(journal: Journal) -> None:
    calls = [("echo", {"text": "a"}), ("echo", {"text": "b"})]
    model = ScriptedModel([Reply(tool_calls=calls), Reply(text="done")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(EchoTool(),))], journal=journal)
    session = await rig.start_session()
    end = await session.ask("go", timeout=30)
    assert isinstance(end, TurnDone)
    actor = session.actors["main"]
    assert actor.inline_tool_runs == 0
    assert [m.content for m in actor.state.history if m.role == "tool"] == ["a", "b"]
    await session.shutdown()


class _CountingEcho(EchoTool):
    """`EchoTool` that counts how often a call of it is prepared."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared = 0

    def prepare(self, call: ToolCall) -> PreparedCall:
        self.prepared += 1
        return super().prepare(call)


async def test_a_call_the_gate_prepared_is_not_prepared_again_to_run(journal: Journal) -> None:
    tool = _CountingEcho()
    replies = [
        Reply(tool_calls=[("echo", {"text": "one"})]),
        Reply(tool_calls=[("echo", {"text": "a"}), ("echo", {"text": "b"})]),
    ]
    model = ScriptedModel([*replies, Reply(text="done")])
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=(tool,))], journal=journal)
    session = await rig.start_session()
    end = await session.ask("go", timeout=30)
    assert isinstance(end, TurnDone)
    assert tool.prepared == 3  # one call alone, then a batch of two: each prepared once, by the gate
    assert [m.content for m in session.actors["main"].state.history if m.role == "tool"] == ["one", "a", "b"]
    await session.shutdown()
