"""Harness events → adapter updates, for the adapters over loopd's own harness (in-process and remote).

`HarnessTranslator` is fed one session's events in journal order (plus live ephemeral ones) and returns the
updates they mean. Only stored events make durable updates, so replaying a journal from seq 1 yields the same
durable updates in the same order; token deltas become previews. The *main* loop (the session's first loop)
carries the visible answer; model calls of every loop (subagents too) are reported for cost roll-ups.

    model_replied (main)     → ModelCalled, TextSet (the step texts so far; none for a whitespace-only text,
                               unless the session was restored since: then its lost run's text may show),
                               ToolStarted per tool call
    model_replied (other)    → ModelCalled
    tool_completed (main)    → ToolFinished (ok → completed, anything else → failed)
    foreign_tool_used (main) → ToolStarted, ToolFinished (a foreign CLI's own tool, recorded once it ended)
    gate_opened / resolved   → GateOpened / GateResolved (main loop)
    user_input_requested     → QuestionAsked (main loop); the ask_user call's tool_completed → QuestionClosed too
    history_compacted        → ModelCalled (action compact)
    turn_done (main)         → ModelCalled, TextSet, Finished(final reply)
    turn_failed (main)       → Failed(error type); turn_interrupted (main) → Failed("interrupted")
    token_delta (main)       → TextPreview at its place in the answer text

The answer text is the texts of the turn's steps joined by a blank line (whitespace-only texts left out). A
preview says where its piece goes in that text: after the texts of the steps already replied, at the delta's
offset in its model call. Deltas are ephemeral, so a subscriber can receive them late (after the journal
delivered the step's reply: dropped here, the reply has the text), lose some (the rest of that step is not
previewed: its reply fills it in) or, after a restore, see a re-issued model call stream from its start again
(the projection shows only what is not shown yet).

The first main-loop turn is the call's turn; its terminal event ends the translation — unless a user's follow-up
(an input whose command id starts with `FOLLOWUP_PREFIX`, see `followup_command_id`) was queued on the main loop
and not yet folded into it: then, by the harness's queued-input rule, the follow-ups start the next turn, which is
the call's too, and the answer goes on (its texts after the earlier turn's). A follow-up folded into the running
turn is simply seen by the model at its next step. Must not do: I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from loopd.harness.core import Usage as HarnessUsage
from loopd.harness.core.decide import ANSWER_PREFIX
from loopd.harness.core.events import (
    ForeignToolUsed,
    HistoryCompacted,
    InputCancelled,
    InputQueued,
    InputRejected,
    InputsFolded,
    ModelReplied,
    SessionRestored,
    SessionStarted,
    TokenDelta,
    ToolCompleted,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    UserInputRequested,
)
from loopd.harness.core.events import (
    GateOpened as HarnessGateOpened,
)
from loopd.harness.core.events import (
    GateResolved as HarnessGateResolved,
)
from loopd.server.ledger import EffectKind, Idempotency

from ._adapter import (
    Failed,
    Finished,
    GateAnswer,
    GateOpened,
    GateResolved,
    ModelCalled,
    QuestionAsked,
    QuestionClosed,
    TextPreview,
    TextSet,
    ToolFinished,
    ToolStarted,
    ToolStatus,
    Update,
)

GATE_TIMEOUT_REASON: Final = "no answer before the gate timed out"
"""The reason the harness runtime gives a gate that closed unanswered (``runtime/_loop.py``)."""

ToolEffects = Callable[[str], tuple[EffectKind, Idempotency]]

FOLLOWUP_PREFIX: Final = "followup:"


def followup_command_id(key: str) -> str:
    """The harness command id of a user's follow-up ``key`` (its input message id): stable, so delivering the same
    follow-up twice is recognised in the journal."""
    return f"{FOLLOWUP_PREFIX}{key}"


def _unknown_effect(_name: str) -> tuple[EffectKind, Idempotency]:
    return EffectKind.UNKNOWN, Idempotency.UNKNOWN


@dataclass(slots=True)
class _StepText:
    """What arrived of one step's model text, in order from its start."""

    step: int
    text: str = ""
    shown: int = 0
    """Characters of ``text`` previewed already (none until the text has more than whitespace)."""
    broken: bool = False
    """A piece went missing: the rest of the step is not previewed."""


def describe_gate(prompt: dict[str, Any]) -> str:
    """One readable line per permission the gate asks for."""
    lines: list[str] = []
    for item in prompt.get("items") or ():
        if not isinstance(item, dict):
            continue
        text = item.get("description") or f"{item.get('kind', 'permission')} {item.get('match', '')}".strip()
        lines.append(f"- {text}")
    return "The harness asks for permission:\n" + "\n".join(lines) if lines else "The harness asks for permission."


class HarnessTranslator:
    def __init__(
        self, *, model_name: str = "unknown", main_loop: str | None = None, tool_effects: ToolEffects | None = None
    ) -> None:
        self._model = model_name
        self._main = main_loop
        self._effects = tool_effects or _unknown_effect
        self._texts: list[str] = []
        self._turn: str | None = None
        self._replied_step = 0
        self._step: _StepText | None = None
        self._restored = False
        self._pending: set[str] = set()  # follow-ups queued on the main loop, not folded or started yet
        self._questions: set[str] = set()  # ask_user questions of the call's turns still open
        self.followups: set[str] = set()
        """Command ids of every follow-up the journal shows reaching the main loop (queued, folded or started)."""
        self.finished = False

    @property
    def main_loop(self) -> str | None:
        return self._main

    def _usage(self, usage: HarnessUsage, action: str = "model_call") -> ModelCalled:
        return ModelCalled(
            model=self._model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=usage.cost_usd,
            action="compact" if action == "compact" else "model_call",
        )

    def _ours(self, loop: str, turn_id: str) -> bool:
        return loop == self._main and turn_id == self._turn

    def _answer(self, step: int, text: str) -> list[Update]:
        self._replied_step = max(self._replied_step, step)
        if self._step is not None and self._step.step <= step:
            self._step = None
        restored, self._restored = self._restored, False
        if text.strip():
            self._texts.append(text)
            return [TextSet("\n\n".join(self._texts))]
        if restored:  # a re-issued call said nothing: text its lost run showed must go
            return [TextSet("\n\n".join(self._texts))]
        return []

    def _preview(self, step: int, text: str, offset: int | None) -> list[Update]:
        if step <= self._replied_step:
            return []  # late: the step's reply (already translated) carries its text
        current = self._step
        if current is None or current.step != step:
            current = self._step = _StepText(step)
        if current.broken:
            return []
        at = len(current.text) if offset is None else offset
        if at != len(current.text):
            if not current.text.startswith(text, at):
                current.broken = True  # a piece is missing (or differs): the reply will fill the text in
            return []
        current.text += text
        if not current.text.strip():
            return []  # nothing to show yet (a whitespace-only step text is left out of the answer)
        base = "\n\n".join(self._texts)
        separator = "\n\n" if self._texts else ""
        if current.shown == 0:
            piece, position = separator + current.text, len(base)
        else:
            piece, position = current.text[current.shown :], len(base) + len(separator) + current.shown
        current.shown = len(current.text)
        return [TextPreview(piece, offset=position)]

    def _taken(self, command_ids: Any) -> None:
        for command_id in command_ids:
            if command_id.startswith(FOLLOWUP_PREFIX):
                self.followups.add(command_id)
                self._pending.discard(command_id)

    def feed(self, event: object) -> list[Update]:
        """The updates ``event`` means (none for most events). After the call's turn ended: always none."""
        if self.finished:
            return []
        match event:
            case SessionStarted(loops=loops):
                if self._main is None and loops:
                    self._main = loops[0]
                return []
            case SessionRestored():
                self._restored = True
                return []
            case TurnStarted(loop=loop, turn_id=turn_id, inputs=inputs):
                if self._main is None:
                    self._main = loop
                if loop == self._main and self._turn is None:
                    self._turn = turn_id
                    self._replied_step, self._step = 0, None  # a continuation turn numbers its steps from 1
                if loop == self._main:
                    self._taken(i.command_id for i in inputs)
                return []
            case InputQueued(loop=loop, command_id=command_id) if loop == self._main:
                if command_id.startswith(FOLLOWUP_PREFIX):
                    self._pending.add(command_id)
                    self.followups.add(command_id)
                return []
            case InputsFolded(loop=loop, inputs=inputs) if loop == self._main:
                self._taken(i.command_id for i in inputs)
                return []
            case InputCancelled(command_id=command_id) | InputRejected(command_id=command_id):
                self._pending.discard(command_id)
                return []
            case TokenDelta(loop=loop, turn_id=turn_id, step=step, text=text, offset=offset):
                if not self._ours(loop, turn_id) or not text:
                    return []
                return self._preview(step, text, offset)
            case ModelReplied(loop=loop, turn_id=turn_id, step=step, text=text, tool_calls=calls, usage=usage):
                updates: list[Update] = [self._usage(usage)]
                if self._ours(loop, turn_id):
                    updates += self._answer(step, text)
                    for call in calls:
                        kind, idempotency = self._effects(call.name)
                        updates.append(ToolStarted(call.id, call.name, dict(call.arguments), kind, idempotency))
                return updates
            case ToolCompleted(loop=loop, turn_id=turn_id, outcome=outcome):
                if not self._ours(loop, turn_id):
                    return []
                status: ToolStatus = "completed" if outcome.status == "ok" else "failed"
                closed: list[Update] = []
                if outcome.call_id in self._questions:
                    self._questions.discard(outcome.call_id)
                    answered = outcome.status == "ok"
                    reply = outcome.output.removeprefix(ANSWER_PREFIX) if answered else ""
                    closed.append(QuestionClosed(outcome.call_id, reply, timed_out=not answered))
                return [*closed, ToolFinished(outcome.call_id, outcome.name, status, outcome.output)]
            case ForeignToolUsed(loop=loop, turn_id=turn_id, call_id=call_id, name=name, arguments=arguments):
                if not self._ours(loop, turn_id):
                    return []
                kind, idempotency = self._effects(name)
                foreign_status: ToolStatus = "failed" if event.is_error else "completed"
                return [
                    ToolStarted(call_id, name, dict(arguments), kind, idempotency),
                    ToolFinished(call_id, name, foreign_status, event.output),
                ]
            case UserInputRequested(loop=loop, turn_id=turn_id, request_id=request_id, question=question):
                if not self._ours(loop, turn_id):
                    return []
                self._questions.add(request_id)
                return [QuestionAsked(request_id, question, tuple(event.choices))]
            case HarnessGateOpened(loop=loop, turn_id=turn_id, gate_id=gate_id, prompt=prompt):
                return [GateOpened(gate_id, describe_gate(prompt))] if self._ours(loop, turn_id) else []
            case HarnessGateResolved(loop=loop, turn_id=turn_id, gate_id=gate_id, answer=wire, granted=granted):
                if not self._ours(loop, turn_id):
                    return []
                answer: GateAnswer = "always" if wire == "approve_always" else wire
                timed_out = event.reason.startswith(GATE_TIMEOUT_REASON)
                return [GateResolved(gate_id, answer, granted, timed_out, event.reason)]
            case HistoryCompacted(usage=usage):
                return [self._usage(usage, "compact")]
            case TurnDone(loop=loop, turn_id=turn_id, step=step, text=text, step_usage=usage):
                updates = [self._usage(usage)]
                if self._ours(loop, turn_id):
                    updates += self._answer(step, text)
                    if self._pending:
                        self._turn = None  # the queued follow-ups start the next turn: it answers them too
                    else:
                        updates.append(Finished(text))
                        self.finished = True
                return updates
            case TurnFailed(loop=loop, turn_id=turn_id, error_type=error_type, message=message):
                if not self._ours(loop, turn_id):
                    return []
                self.finished = True
                return [Failed(error_type or "turn_failed", message)]
            case TurnInterrupted(loop=loop, turn_id=turn_id, reason=reason):
                if not self._ours(loop, turn_id):
                    return []
                self.finished = True
                return [Failed("interrupted", reason)]
            case _:
                return []
