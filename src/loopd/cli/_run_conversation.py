"""A conversation with one harness session in the terminal: turns, the REPL, inline gates and Ctrl-C.

`Conversation.on_sigint` is the only Ctrl-C handler while the session is open. What it does depends on the
phase: at the prompt it wakes the pending read (the REPL quits on the second press in a row); while a permission
question is asked the first press only says how to leave and the second quits with the question still open (the
gate is journaled: `loopd run --resume` asks it again); during the rest of a turn the first press interrupts the
turn (`Session.interrupt`) and a second one quits; in any other phase it quits. Quitting cancels the main task;
the caller shuts the session down and closes the rig while that cancellation unwinds.

A restored session may have turns parked at an open gate: `resume_open_turns` asks those questions as if they had
just been opened and follows the turns to their end before anything else is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from loopd.cli._run_input import InputInterrupted, LineInput
from loopd.cli._run_settings import is_setting_command, setting_command
from loopd.cli._run_view import RunView
from loopd.cli._run_workspace import WORKSPACE_COMMANDS, workspace_command
from loopd.harness import (
    HarnessError,
    MailboxFullError,
    Session,
    SessionClosedError,
    SubscriptionLostError,
    ToolCall,
)
from loopd.harness.actors import Envelope, Subscription
from loopd.harness.core.events import (
    ContextMeasured,
    ContextPressure,
    EphemeralEvent,
    GateOpened,
    GateResolved,
    InputCancelled,
    InputRejected,
    InputsFolded,
    LoopEvent,
    ModelReplied,
    ModelRetrying,
    SessionEvent,
    TokenDelta,
    ToolCallStarted,
    ToolCompleted,
    ToolProgress,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
)
from loopd.harness.core.state import SessionState, TurnState
from loopd.harness.gate import GateAnswer, GatePolicy
from loopd.harness.tools import ASK_USER

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INTERRUPTED: Final = 130

Phase = Literal["starting", "prompt", "turn", "idle", "closing"]
TurnEnd = Literal["done", "failed", "interrupted", "dropped"]

_ANSWERS: Final = {
    "a": GateAnswer.APPROVE,
    "approve": GateAnswer.APPROVE,
    "once": GateAnswer.APPROVE,
    "y": GateAnswer.APPROVE,
    "yes": GateAnswer.APPROVE,
    "l": GateAnswer.APPROVE_ALWAYS,
    "always": GateAnswer.APPROVE_ALWAYS,
    "d": GateAnswer.DENY,
    "deny": GateAnswer.DENY,
    "n": GateAnswer.DENY,
    "no": GateAnswer.DENY,
}
_QUIT_COMMANDS: Final = frozenset({"/exit", "/quit"})
_SUBSCRIPTION_QUEUE: Final = 1024
_INTERRUPT_WAIT: Final = 30.0
"""Seconds the end of a turn waits for the session to take a Ctrl-C's interrupt before it gives up on it."""

Event = SessionEvent | LoopEvent | EphemeralEvent


def parse_gate_answer(line: str) -> GateAnswer | None:
    """``a`` / ``l`` / ``d`` (or approve / always / deny, yes / no); None for anything else."""
    return _ANSWERS.get(line.strip().lower())


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    end: TurnEnd
    event: TurnDone | TurnFailed | TurnInterrupted | None = None

    @property
    def exit_code(self) -> int:
        if self.end == "done":
            return EXIT_OK
        if self.end == "interrupted":
            return EXIT_INTERRUPTED
        return EXIT_FAILED


class Conversation:
    """Drives ``session`` from the terminal. Create it before the session opens; `attach` it once open."""

    def __init__(
        self,
        *,
        view: RunView,
        terminal: LineInput,
        policy: GatePolicy,
        rules_file: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._view = view
        self._terminal = terminal
        self._policy = policy
        self._rules_file = rules_file
        self._clock = clock
        self._session: Session | None = None
        self._main: asyncio.Task[object] | None = None
        self._phase: Phase = "starting"
        self._interrupt_requested = False
        self._interrupt_task: asyncio.Task[None] | None = None
        self._asking = False
        self._question_presses = 0
        self.quit_code: int | None = None
        self.unmetered_chars = 0
        """Characters streamed by model calls cut short in this process: their usage is never reported."""

    @property
    def session(self) -> Session:
        if self._session is None:
            raise RuntimeError("the conversation has no session yet")
        return self._session

    def bind_main_task(self, task: asyncio.Task[object]) -> None:
        self._main = task

    def attach(self, session: Session) -> None:
        self._session = session
        self._enter("idle")

    def closing(self) -> None:
        self._phase = "closing"

    # --- Ctrl-C -------------------------------------------------------------------------------------------

    def on_sigint(self) -> None:
        match self._phase:
            case "prompt":
                self._terminal.interrupt()
            case "turn" if self._asking:
                # Quitting leaves the question open (the gate is journaled); it does not interrupt the turn.
                self._question_presses += 1
                if self._question_presses >= 2:
                    self.quit()
                else:
                    self._terminal.interrupt()  # `_ask` explains and asks again
            case "turn" if not self._interrupt_requested and self._session is not None:
                self._interrupt_requested = True
                self._view.interrupting()
                self._terminal.interrupt()  # stops a pending permission question
                self._interrupt_task = asyncio.create_task(self._interrupt(self._session))
            case "closing":
                self._view.note("closing the session…")
            case _:
                self.quit()

    def quit(self, code: int = EXIT_INTERRUPTED) -> None:
        """Leave now: cancel the main task (once); the caller cleans up and exits with ``code``."""
        if self.quit_code is not None:
            return
        self.quit_code = code
        if self._phase == "closing":
            return  # already cleaning up: let it finish
        self._phase = "closing"
        if self._main is not None and not self._main.done():
            self._main.cancel()

    def _enter(self, phase: Phase) -> None:
        if self._phase != "closing":  # nothing leaves "closing": later presses must not cancel the cleanup
            self._phase = phase

    async def _interrupt(self, session: Session) -> None:
        try:
            await session.interrupt(reason="interrupted from the terminal (Ctrl-C)")
        except HarnessError as exc:
            self._view.warning(f"could not interrupt: {exc}")

    # --- modes --------------------------------------------------------------------------------------------

    async def one_shot(self, text: str) -> int:
        outcome = await self.run_turn(text)
        return outcome.exit_code

    async def repl(self) -> int:
        interactive = self._terminal.interactive
        if interactive:
            self._view.repl_banner()
        presses = 0
        while True:
            if interactive:
                self._view.prompt()
            self._enter("prompt")
            try:
                line = await self._terminal.readline()
            except InputInterrupted:
                presses += 1
                if presses >= 2:
                    self._view.close()
                    return EXIT_INTERRUPTED
                self._view.note("(Ctrl-C again to quit; /exit or Ctrl-D also quit)")
                continue
            finally:
                self._enter("idle")
            if line is None:
                self._view.close()
                return EXIT_OK
            self._view.answered()
            presses = 0
            text = line.strip()
            if not text:
                continue
            if text in _QUIT_COMMANDS:
                return EXIT_OK
            if text == "/help":
                self._view.repl_help()
                continue
            if text in WORKSPACE_COMMANDS:
                await workspace_command(self.session, self._view, text)
                continue
            if is_setting_command(text):
                await setting_command(self.session, self._view, text)
                continue
            if not interactive:
                self._view.echo_input(text)
            await self.run_turn(text)

    # --- one turn -----------------------------------------------------------------------------------------

    async def run_turn(self, text: str) -> TurnOutcome:
        """Submit ``text`` and render its turn until the turn ends. Raises the session's fault if it breaks."""
        session = self.session
        self._interrupt_requested = False
        self._enter("turn")
        subscription = session.subscribe(maxsize=_SUBSCRIPTION_QUEUE)
        turn = _TurnTracker()
        try:
            try:
                command_id = await session.submit(text)
            except MailboxFullError as exc:
                self._view.warning(f"the session is busy, the input was not queued: {exc}")
                return TurnOutcome("dropped")
            self._view.thinking()
            return await self._follow_turn(session, subscription, turn, command_id)
        finally:
            await self._end_turn(turn, subscription)

    async def resume_open_turns(self) -> list[TurnOutcome]:
        """Ask the questions a restored session still waits on, following each such turn to its end.

        Each parked turn is shown as if its `GateOpened` had just arrived (same panel, same answers, the gate's
        own deadline; without a terminal, the policy's unattended answer). Returns the outcomes, in order.
        """
        outcomes: list[TurnOutcome] = []
        while True:
            session = self.session
            self._interrupt_requested = False
            self._enter("turn")
            # Subscribe before reading the state: state changes and their events are published together, so
            # whatever happens to the gate from here on (an answer, its deadline) reaches this subscription.
            subscription = session.subscribe(maxsize=_SUBSCRIPTION_QUEUE)
            parked = open_gates(session.state)
            turn = _TurnTracker()
            try:
                if not parked:
                    asking = open_questions(session.state)
                    if not asking:
                        return outcomes
                    loop, state = asking[0]
                    turn.turn_id = state.turn_id
                    turn.calls.update({c.id: c for c in state.calls})
                    for ask in state.asks:  # every question of the step, asked in turn
                        requested = UserInputRequested(
                            loop=loop,
                            turn_id=state.turn_id,
                            step=state.step,
                            request_id=ask.request_id,
                            question=ask.question,
                            choices=ask.choices,
                            deadline=ask.deadline,
                            at=self._clock(),
                        )
                        await self._on_event(session, turn, None, requested)
                    outcomes.append(await self._follow_turn(session, subscription, turn, None))
                    continue
                loop, state = parked[0]
                gate = state.gate
                if gate is None:  # open_gates only returns turns with a gate
                    raise RuntimeError("a parked turn without a gate")
                turn.turn_id = state.turn_id
                turn.calls.update({c.id: c for c in state.calls})
                opened = GateOpened(
                    loop=loop,
                    turn_id=state.turn_id,
                    step=state.step,
                    gate_id=gate.gate_id,
                    call_ids=gate.call_ids,
                    prompt=dict(gate.prompt),
                    deadline=gate.deadline,
                    at=self._clock(),
                )
                await self._on_event(session, turn, None, opened)
                outcomes.append(await self._follow_turn(session, subscription, turn, None))
            finally:
                await self._end_turn(turn, subscription)

    async def _follow_turn(
        self, session: Session, subscription: Subscription, turn: _TurnTracker, command_id: str | None
    ) -> TurnOutcome:
        async with contextlib.aclosing(self._follow(session, subscription)) as events:
            async for env in events:
                outcome = await self._on_event(session, turn, command_id, env.event)
                if outcome is not None:
                    return outcome
        raise session.fault or SessionClosedError(f"session {session.id} stopped during the turn")

    async def _end_turn(self, turn: _TurnTracker, subscription: Subscription) -> None:
        try:
            await _cancel(turn.gate_task)
            await _cancel(turn.ask_task)
        finally:
            await subscription.aclose()
            # Read after the last other await: a Ctrl-C during the ones above may just have started an interrupt.
            interrupting, self._interrupt_task = self._interrupt_task, None
            if interrupting is not None:
                try:
                    await asyncio.wait({interrupting}, timeout=_INTERRUPT_WAIT)
                finally:
                    await _cancel(interrupting)  # still pending after the wait: stopped, never left running
            self._view.stop_spinner()
            self._enter("idle")

    async def _on_event(
        self, session: Session, turn: _TurnTracker, command_id: str | None, event: Event
    ) -> TurnOutcome | None:
        """Render one event of the session; the outcome once this input's turn has ended."""
        if isinstance(event, TurnStarted | InputsFolded):
            if any(i.command_id == command_id for i in event.inputs):
                turn.turn_id = event.turn_id
            return None
        if isinstance(event, InputCancelled | InputRejected):
            if command_id is None or event.command_id != command_id:
                return None
            self._view.input_dropped(event.kind, event.reason)
            return TurnOutcome("interrupted" if self._interrupt_requested else "dropped")
        if turn.turn_id is None or getattr(event, "turn_id", None) != turn.turn_id:
            return None
        match event:
            case TokenDelta(step=step, text=piece):
                turn.text_steps.add(step)
                turn.streamed[step] = turn.streamed.get(step, 0) + len(piece)
                self._view.text(piece)
            case ModelReplied(step=step, tool_calls=calls):
                turn.replied_steps.add(step)
                turn.calls.update({c.id: c for c in calls})
            case ToolCallStarted(name=name, summary=summary):
                self._view.tool_started(name, summary)
            case ToolProgress(call_id=call_id, message=message):
                call = turn.calls.get(call_id)
                self._view.tool_progress(call.name if call else "tool", message)
            case ToolCompleted(outcome=outcome):
                if outcome.name == ASK_USER:
                    await self._question_closed(session, turn, outcome.call_id)
                self._view.tool_completed(outcome)
            case ModelRetrying():
                self._view.retrying(event)
            case ContextMeasured():
                turn.context = event
            case ContextPressure():
                self._view.context_pressure(event)
            case UserInputRequested():
                # Questions are asked one at a time, in order (a step may ask several): each line answers one.
                turn.questions.append(event)
                if turn.ask_task is None or turn.ask_task.done():
                    turn.ask_task = asyncio.create_task(self._answer_questions(session, turn))
            case GateOpened():
                await _cancel(turn.gate_task)
                self._view.gate_opened(event, turn.calls_for(session), now=self._clock())
                turn.gate_task = asyncio.create_task(self._answer_gate(session, event))
            case GateResolved():
                await _cancel(turn.gate_task)
                turn.gate_task = None
                self._view.gate_resolved(event, rules_file=self._rules_file)
            case TurnDone():
                self._view.turn_done(event, text_shown=event.step in turn.text_steps, context=turn.context)
                return TurnOutcome("done", event)
            case TurnFailed():
                self._view.turn_failed(event, unmetered_chars=self._unmetered(turn))
                return TurnOutcome("failed", event)
            case TurnInterrupted():
                self._view.turn_interrupted(event, unmetered_chars=self._unmetered(turn))
                return TurnOutcome("interrupted", event)
        return None

    def _unmetered(self, turn: _TurnTracker) -> int:
        chars = turn.unmetered_chars()
        self.unmetered_chars += chars
        return chars

    async def _follow(self, session: Session, subscription: Subscription) -> AsyncGenerator[Envelope, None]:
        """The subscription's events; after a lost subscription, catch up from the journal and go on."""
        sub = subscription
        try:
            while True:
                try:
                    async for env in sub:
                        yield env
                    return
                except SubscriptionLostError as exc:
                    if sub is not subscription:
                        await sub.aclose()
                    self._view.warning("fell behind the live events; catching up from the journal")
                    sub = session.subscribe(from_seq=exc.last_seq + 1, maxsize=_SUBSCRIPTION_QUEUE)
        finally:
            if sub is not subscription:
                await sub.aclose()

    # --- questions from the model (ask_user) ---------------------------------------------------------------

    async def _answer_questions(self, session: Session, turn: _TurnTracker) -> None:
        """Ask the turn's open questions one after the other, oldest first, until none is left."""
        first = True
        while turn.questions:
            event = turn.questions[0]
            self._view.user_question(event, now=self._clock(), waiting=len(turn.questions) - 1)
            await self._answer_question(session, event, discard=first)  # the next ones: lines typed in a row
            first = False
            if turn.questions and turn.questions[0] is event:
                turn.questions.pop(0)

    async def _question_closed(self, session: Session, turn: _TurnTracker, request_id: str) -> None:
        """A question got its tool result (answered, or past its deadline): stop reading for it if it is the one
        being asked, and go on with the next."""
        asked = turn.questions[0].request_id if turn.questions else None
        turn.questions = [q for q in turn.questions if q.request_id != request_id]
        if asked == request_id and turn.ask_task is not None:
            await _cancel(turn.ask_task)
            turn.ask_task = None
            if turn.questions:
                turn.ask_task = asyncio.create_task(self._answer_questions(session, turn))

    async def _answer_question(self, session: Session, event: UserInputRequested, *, discard: bool = True) -> None:
        """The user's next line answers the question (a number picks a choice); end of input answers "no answer".
        ``discard``: drop what was typed before the question first (not for the next question of a series)."""
        if discard:
            self._terminal.discard_pending()
        self._asking = True
        self._question_presses = 0
        try:
            async with asyncio.timeout(max(0.0, event.deadline - self._clock())):
                while True:
                    if self._terminal.interactive:
                        self._view.user_question_prompt()
                    try:
                        line = await self._terminal.readline()
                    except InputInterrupted:
                        if self._question_presses == 0:
                            return
                        self._view.question_kept(session.id)
                        continue
                    break
        except TimeoutError:
            return  # the runtime closes the question at its deadline
        finally:
            self._asking = False
            self._question_presses = 0
        self._view.answered()
        text = pick_answer(line, event.choices)
        try:
            await session.provide_user_input(event.request_id, text, loop=event.loop)
        except HarnessError as exc:
            self._view.warning(f"the answer was not taken: {exc}")

    # --- the gate -----------------------------------------------------------------------------------------

    async def _answer_gate(self, session: Session, event: GateOpened) -> None:
        if self._terminal.interactive:
            answer = await self._ask(event)
            if answer is None:
                return  # no answer: the runtime denies at the deadline, or the turn is being interrupted
        else:
            answer = self._policy.unattended
            self._view.gate_unattended(answer)
        try:
            await session.answer_gate(event.gate_id, answer.value)
        except HarnessError as exc:
            self._view.warning(f"the answer was not taken: {exc}")

    async def _ask(self, event: GateOpened) -> GateAnswer | None:
        self._terminal.discard_pending()
        self._asking = True
        self._question_presses = 0
        try:
            async with asyncio.timeout(max(0.0, event.deadline - self._clock())):
                while True:
                    self._view.gate_question()
                    try:
                        line = await self._terminal.readline()
                    except InputInterrupted:
                        if self._question_presses == 0:
                            return None  # woken by something other than Ctrl-C at this question
                        self._view.question_kept(self.session.id)
                        continue
                    if line is None:
                        return GateAnswer.DENY  # Ctrl-D
                    self._view.answered()
                    answer = parse_gate_answer(line)
                    if answer is not None:
                        return answer
                    self._view.gate_invalid(line)
        except TimeoutError:
            return None
        finally:
            self._asking = False
            self._question_presses = 0


NO_INPUT_ANSWER: Final = "(the user's input ended without an answer)"


def pick_answer(line: str | None, choices: tuple[str, ...]) -> str:
    """The answer a typed line gives: a choice's number picks that choice; end of input says there is none."""
    if line is None:
        return NO_INPUT_ANSWER
    text = line.strip()
    if text.isdigit() and 1 <= int(text) <= len(choices):
        return choices[int(text) - 1]
    return text or NO_INPUT_ANSWER


def open_questions(state: SessionState) -> list[tuple[str, TurnState]]:
    """The turns of ``state`` parked on an ask_user question, as (loop name, turn), in loop order."""
    return [(name, loop.turn) for name, loop in state.loops.items() if loop.turn is not None and loop.turn.asks]


def open_gates(state: SessionState) -> list[tuple[str, TurnState]]:
    """The turns of ``state`` parked at an open permission question, as (loop name, turn), in loop order."""
    return [
        (name, loop.turn) for name, loop in state.loops.items() if loop.turn is not None and loop.turn.gate is not None
    ]


class _TurnTracker:
    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.calls: dict[str, ToolCall] = {}
        self.text_steps: set[int] = set()
        self.streamed: dict[int, int] = {}
        """Characters of text streamed per step."""
        self.replied_steps: set[int] = set()
        """Steps whose model call completed (`ModelReplied` carries its usage)."""
        self.gate_task: asyncio.Task[None] | None = None
        self.ask_task: asyncio.Task[None] | None = None
        self.questions: list[UserInputRequested] = []
        """The turn's open ask_user questions, oldest first; the first is the one being asked."""
        self.context: ContextMeasured | None = None
        """The turn's last context measurement (shown on its done line)."""

    def unmetered_chars(self) -> int:
        """Characters streamed by model calls that never completed: the usage the turn's total leaves out."""
        return sum(chars for step, chars in self.streamed.items() if step not in self.replied_steps)

    def calls_for(self, session: Session) -> dict[str, ToolCall]:
        """Calls seen in this turn, plus those of the turn's state (a turn restored with an open gate)."""
        calls = dict(self.calls)
        for loop in session.state.loops.values():
            if loop.turn is not None and loop.turn.turn_id == self.turn_id:
                calls.update({c.id: c for c in loop.turn.calls})
        return calls


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if still running), wait for it, and re-raise what it raised (other than cancellation)."""
    if task is not None:
        if not task.done():
            task.cancel()
        await asyncio.wait({task})
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error
