"""The ask_user tool: the model asks the user a question mid-turn and the turn parks until the answer.

The tool does no work of its own. A loop that meets an ask_user call journals `UserInputRequested` (with a deadline)
instead of running it; `ProvideUserInput` answers it, and the answer (or "no answer" once the deadline passed) is the
call's tool result. Nothing runs while the turn waits, so the question survives a shutdown or a crash and is asked
again after the restore.
"""

from __future__ import annotations

import functools
from typing import Final

from pydantic import Field, ValidationError

from loopd.harness._errors import ToolArgumentsError
from loopd.harness.core import EffectKind, Idempotency, ToolCall
from loopd.harness.models import ToolSpec
from loopd.harness.tools._base import ToolArgs, describe_validation, json_schema
from loopd.harness.tools._protocol import PreparedCall, ToolContext, ToolResult

ASK_USER: Final = "ask_user"
ASK_TIMEOUT_DEFAULT: Final = 600.0
"""Seconds a question waits for its answer by default."""


class AskUserArgs(ToolArgs):
    question: str = Field(min_length=1, max_length=4000, description="The question, complete and self-contained.")
    choices: list[str] = Field(
        default_factory=list,
        max_length=12,
        description="Optional answers to offer; the user may still answer in their own words.",
    )


@functools.cache
def _ask_spec() -> ToolSpec:
    """The spec never changes (and is immutable): built once, not per session (its JSON schema is the cost)."""
    return ToolSpec(
        name=ASK_USER,
        description=(
            "Ask the user a question when you cannot go on without their decision or a fact only they know. "
            "The turn waits for the answer, which comes back as this tool's result. Ask one clear question."
        ),
        parameters=json_schema(AskUserArgs),
    )


class AskUserTool:
    """Ask the user a question and wait for the answer (up to ``timeout`` seconds, then "no answer")."""

    def __init__(self, *, timeout: float = ASK_TIMEOUT_DEFAULT) -> None:
        if timeout <= 0:
            raise ValueError("an ask_user timeout must be positive")
        self.timeout = timeout

    @property
    def spec(self) -> ToolSpec:
        return _ask_spec()

    @property
    def effect(self) -> EffectKind:
        return EffectKind.NONE

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency.NONE

    def parse(self, call: ToolCall) -> AskUserArgs:
        """The validated question (`ToolArgumentsError` when the model sent something else)."""
        try:
            args = AskUserArgs.model_validate(call.arguments)
        except ValidationError as exc:
            raise ToolArgumentsError(f"invalid arguments for {ASK_USER}: {describe_validation(exc)}") from exc
        if any(not c.strip() or len(c) > 200 for c in args.choices):
            raise ToolArgumentsError(f"invalid arguments for {ASK_USER}: a choice is empty or longer than 200")
        return args

    def prepare(self, call: ToolCall) -> PreparedCall:
        args = self.parse(call)
        return PreparedCall(
            call_id=call.id, tool=ASK_USER, arguments=args.model_dump(mode="json"), summary=args.question[:120]
        )

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        # A loop never runs this tool: it parks the turn on the question instead (see the module docstring).
        return ToolResult(output="ask_user can only be answered inside a loop", is_error=True)
