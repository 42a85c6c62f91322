"""The closed vocabulary of commands a client sends to a session, with a versioned stored/wire form.

`Interrupt` and `Shutdown` travel on the mailbox's priority lane.
"""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import Field, TypeAdapter

from loopd.harness.core._values import Frozen


class _Command(Frozen):
    version: ClassVar[int] = 1
    priority: ClassVar[bool] = False
    command_id: str
    loop: str | None = None


class UserInput(_Command):
    kind: Literal["user_input"] = "user_input"
    text: str = Field(min_length=1)


class CancelQueuedInput(_Command):
    kind: Literal["cancel_queued_input"] = "cancel_queued_input"
    target_command_id: str


class AnswerGate(_Command):
    """Answer an open gate: exactly one of three answers."""

    priority: ClassVar[bool] = True
    kind: Literal["answer_gate"] = "answer_gate"
    gate_id: str
    answer: Literal["approve", "approve_always", "deny"]


class ProvideUserInput(_Command):
    """Answer an open ask_user question (``request_id`` is the tool call's id); the first answer binds."""

    priority: ClassVar[bool] = True
    kind: Literal["provide_user_input"] = "provide_user_input"
    request_id: str
    text: str = Field(max_length=65536)


class SetActiveLoop(_Command):
    """Make ``loop`` the session's active loop: input that names no loop goes there."""

    kind: Literal["set_active_loop"] = "set_active_loop"
    loop: str = Field(min_length=1)  # required here


class SetLoopMode(_Command):
    """Switch a loop (None: the active one) to one of its declared modes, from its next step on."""

    kind: Literal["set_loop_mode"] = "set_loop_mode"
    mode: str = Field(min_length=1)


class ChangeLoopInference(_Command):
    """Switch a loop's model (None: the active loop) for its next model call."""

    kind: Literal["change_loop_inference"] = "change_loop_inference"
    model: str = Field(min_length=1)


class Interrupt(_Command):
    priority: ClassVar[bool] = True
    kind: Literal["interrupt"] = "interrupt"
    reason: str = "interrupted"


class Shutdown(_Command):
    priority: ClassVar[bool] = True
    kind: Literal["shutdown"] = "shutdown"
    drain_timeout: float = Field(default=5.0, ge=0)


AnyCommand = (
    UserInput
    | CancelQueuedInput
    | AnswerGate
    | ProvideUserInput
    | Interrupt
    | Shutdown
    | SetActiveLoop
    | SetLoopMode
    | ChangeLoopInference
)
Command = Annotated[AnyCommand, Field(discriminator="kind")]
COMMAND_ADAPTER: TypeAdapter[AnyCommand] = TypeAdapter(Command)


def encode_command(command: AnyCommand) -> bytes:
    """The wire form: the command's fields plus `kind` and `v` (its schema version)."""
    body = command.model_dump(mode="json")
    body["v"] = command.version
    return _dumps(body)


def decode_command(data: bytes | str) -> AnyCommand:
    body = json.loads(data)
    if not isinstance(body, dict):
        raise ValueError("a command is a JSON object")
    body.pop("v", None)
    return COMMAND_ADAPTER.validate_python(body)


def _dumps(body: dict[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
