"""ask_user: the model asks mid-turn, the turn parks (`UserInputRequested`), `ProvideUserInput` resumes it."""

from __future__ import annotations

import asyncio

import pytest

from loopd._infra.clock import VirtualClock
from loopd.harness import (
    LoopDefinition,
    MemoryJournal,
    ModelRequest,
    NoSuchQuestionError,
    Reply,
    Rig,
    ScriptedModel,
)
from loopd.harness.core import LoopConfig, LoopState, ToolCall, ToolOutcome, decide, recover
from loopd.harness.core.apply import apply_loop
from loopd.harness.core.commands import ProvideUserInput
from loopd.harness.core.decide import NO_ANSWER
from loopd.harness.core.events import (
    ModelReplied,
    ToolCompleted,
    TurnDone,
    TurnStarted,
    UserInputRequested,
)
from loopd.harness.core.inputs import ArmAsk, CallModel, UserInputExpired, UserInputNeeded
from loopd.harness.core.state import OpenAsk
from loopd.harness.tools import AskUserTool

from .helpers import journal_state, same_loops

QUESTION = {"question": "Which database?", "choices": ["sqlite", "postgres"]}


def _model() -> ScriptedModel:
    """Asks once, then answers with whatever the tool result said."""

    def script(request: ModelRequest) -> Reply:
        results = [m for m in request.messages if m.role == "tool"]
        if not results:
            return Reply(tool_calls=[ToolCall(id="ask-1", name="ask_user", arguments=QUESTION)])
        return Reply(text=f"done: {results[-1].content}")

    return ScriptedModel(script)


def _rig(journal: MemoryJournal, clock: VirtualClock | None = None, timeout: float = 60.0) -> Rig:
    loop = LoopDefinition(name="main", model=_model(), tools=(AskUserTool(timeout=timeout),))
    if clock is None:
        return Rig(loops=[loop], journal=journal)
    return Rig(loops=[loop], journal=journal, clock=clock)


async def _wait_for_question(session: object, timeout: float = 10.0) -> OpenAsk:
    async with asyncio.timeout(timeout):
        while True:
            questions = session.open_questions()  # type: ignore[attr-defined]
            if questions:
                return questions[0][1]  # type: ignore[no-any-return]
            await asyncio.sleep(0.005)


# --- the pure decisions --------------------------------------------------------------------------------------


def _parked_state() -> LoopState:
    state = LoopState(name="main")
    call = ToolCall(id="ask-1", name="ask_user", arguments=QUESTION)
    for event in (
        TurnStarted(loop="main", turn_id="main/1", inputs=(), at=0.0),
        ModelReplied(loop="main", turn_id="main/1", step=1, text="", tool_calls=(call,), usage=_zero()),
        UserInputRequested(
            loop="main", turn_id="main/1", step=1, request_id="ask-1", question="Which database?", deadline=50.0, at=0
        ),
    ):
        state = apply_loop(state, event)
    return state


def _zero():  # type: ignore[no-untyped-def]
    from loopd.harness.core import ZERO_USAGE

    return ZERO_USAGE


def test_a_needed_question_is_journaled_with_its_deadline_and_armed() -> None:
    state = _parked_state()
    assert state.turn is not None and state.turn.asks[0].request_id == "ask-1"
    fresh = apply_loop(state, ToolCompleted(loop="main", turn_id="main/1", step=1, outcome=_ok("x")))
    assert fresh.turn is not None and fresh.turn.asks == ()
    # Asking again for the same call decides nothing; a question for a call that is not open neither.
    config = LoopConfig(name="main")
    again = UserInputNeeded("main/1", 1, "ask-1", "again?", (), 99.0)
    assert decide(state, again, config=config, now=1.0).events == ()
    unknown = UserInputNeeded("main/1", 1, "nope", "?", (), 99.0)
    assert decide(state, unknown, config=config, now=1.0).events == ()


def _ok(output: str) -> ToolOutcome:
    return ToolOutcome(call_id="ask-1", name="ask_user", status="ok", output=output)


def test_the_first_answer_binds_and_the_step_goes_on() -> None:
    config = LoopConfig(name="main")
    state = _parked_state()
    answer = ProvideUserInput(command_id="c", request_id="ask-1", text="postgres")
    decision = decide(state, answer, config=config, now=2.0)
    completed = [e for e in decision.events if isinstance(e, ToolCompleted)]
    assert completed[0].outcome.output == "The user answered: postgres"
    assert any(isinstance(e, CallModel) for e in decision.effects)  # the next step's model call
    after = state
    for e in decision.events:
        after = apply_loop(after, e)
    # A second answer (or a late deadline) finds no open question: nothing happens.
    assert decide(after, answer, config=config, now=3.0).events == ()
    assert decide(after, UserInputExpired("main/1", 1, "ask-1"), config=config, now=60.0).events == ()


def test_past_the_deadline_the_tool_result_says_no_answer() -> None:
    decision = decide(_parked_state(), UserInputExpired("main/1", 1, "ask-1"), config=LoopConfig(name="main"), now=51)
    completed = [e for e in decision.events if isinstance(e, ToolCompleted)]
    assert completed[0].outcome.output == NO_ANSWER and completed[0].outcome.status == "error"


@pytest.mark.parametrize("mode", ["interrupt", "resume"])
def test_a_parked_question_survives_recovery_in_both_modes(mode: str) -> None:
    decision = recover(_parked_state(), config=LoopConfig(name="main"), mode=mode, idempotent=lambda _: False, now=9)
    assert decision.events == ()
    assert decision.effects == (ArmAsk(turn_id="main/1", step=1, request_id="ask-1", deadline=50.0),)


# --- the runtime ---------------------------------------------------------------------------------------------


async def test_the_turn_parks_on_the_question_and_the_answer_resumes_it() -> None:
    journal = MemoryJournal()
    rig = _rig(journal)
    session = await rig.start_session()
    asked = asyncio.create_task(session.ask("set up the project", timeout=10))
    ask = await _wait_for_question(session)
    assert ask.question == "Which database?" and ask.choices == ("sqlite", "postgres")
    assert not asked.done()
    with pytest.raises(NoSuchQuestionError):
        await session.provide_user_input("not-a-question", "x")
    await session.provide_user_input(ask.request_id, "postgres")
    done = await asked
    assert isinstance(done, TurnDone) and done.text == "done: The user answered: postgres"
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()


async def test_no_answer_before_the_deadline_tells_the_model_so() -> None:
    clock = VirtualClock()
    journal = MemoryJournal()
    session = await _rig(journal, clock, timeout=30.0).start_session()
    asked = asyncio.create_task(session.ask("set up the project", timeout=10))
    await _wait_for_question(session)
    await clock.advance(31.0)
    done = await asked
    assert isinstance(done, TurnDone) and done.text == f"done: {NO_ANSWER}"
    await session.shutdown()


@pytest.mark.parametrize("how", ["crash", "shutdown"])
async def test_a_question_survives_a_crash_or_shutdown_and_is_answered_after_the_restore(how: str) -> None:
    journal = MemoryJournal()
    rig = _rig(journal)
    session = await rig.start_session()
    await session.submit("set up the project")
    ask = await _wait_for_question(session)
    if how == "crash":
        session.abort()
    else:
        await session.shutdown()  # a parked turn is not interrupted by a shutdown
    restored = await rig.restore_session(session.id)
    assert [a.request_id for _, a in restored.open_questions()] == [ask.request_id]
    sub = restored.subscribe()
    await restored.provide_user_input(ask.request_id, "sqlite")
    async with asyncio.timeout(10):
        async for env in sub:
            if isinstance(env.event, TurnDone):
                assert env.event.text == "done: The user answered: sqlite"
                break
    await sub.aclose()
    same_loops(restored.state, await journal_state(journal, session.id))
    await restored.shutdown()
