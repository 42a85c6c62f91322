"""The adapter seam: what the Harness Engine asks of a harness, and the closed vocabulary of what it reports.

An adapter (`HarnessAdapter`) starts or resumes one execution per call and hands back an `AdapterRun`: an async
stream of `Update` values plus ``answer_gate`` / ``cancel`` / ``aclose``. Adapters never touch the database or
messages; the engine projects updates, counts them and writes the ledger. Provider differences stop here.

Updates are *durable* or *previews*:

- durable updates (`TextSet`, `ToolStarted`, `ToolFinished`, `GateOpened`, `GateResolved`, `ModelCalled`,
  `Finished`, `Failed`) are counted: the engine stores how many it applied (the call's ``checkpoint``) and a hash
  chain over them. A resumed run of an adapter whose ``replays`` is true replays the same ordered durable
  updates from the start: those at or below the checkpoint are skipped (a different update at the checkpoint
  fails the call, "replay differs").
- `TextPreview` (live token text, with its position in the answer) is not counted and never replayed: the
  part of it the answer block does not show yet is appended for watchers; the next durable `TextSet` appends
  what is still missing (a `set` only where the shown text disagrees with it).

Must not do: I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Final, Literal, Protocol, runtime_checkable

from loopd.server.ledger import EffectKind, Idempotency

from ._prompts import RecordedCall

GateAnswer = Literal["approve", "always", "deny"]
GATE_ANSWERS: tuple[GateAnswer, ...] = ("approve", "always", "deny")
ToolStatus = Literal["completed", "failed"]
FailurePhase = Literal["failed", "cancelled", "timed_out"]


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One visible message before the request: who (``kind`` user | harness | operator, ``key``) said what."""

    kind: str
    key: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "key": self.key, "text": self.text}


CONVERSATION_SO_FAR: Final = "Conversation so far:"
"""What introduces a prompt's history (`AdapterRequest.prompt`) for a session that starts with it."""
SINCE_LAST_ANSWER: Final = "Said in the conversation since your last answer:"
"""What introduces it for a session that holds the conversation up to its last answer."""


@dataclass(frozen=True, slots=True)
class AdapterRequest:
    """What an adapter is asked to run. ``call_id`` doubles as the idempotency key of the execution."""

    call_id: str
    target: str
    text: str
    history: tuple[HistoryEntry, ...]
    options: Mapping[str, Any]
    deadline: datetime
    timeout: float
    """Seconds left until ``deadline`` when the request was built."""
    workspace: str | None = None
    """The call's own workspace, relative to the engine's workspaces root (None: the target's own)."""
    tools: str | None = None
    """The call's tools profile (``none`` | ``read`` | ``write``; None: the target's own tools and gates)."""
    fork: tuple[str, int] | None = None
    """Start the execution as a fork of harness session ``fork[0]`` at its journal seq ``fork[1]`` (a settled
    point): it answers from that harness state instead of a fresh one (`ForkCapable` adapters only)."""

    def prompt(self, *, since_last_answer: bool = False) -> str:
        """The task text, preceded by the visible history when there is any. ``since_last_answer``: the session
        that takes it already holds the conversation up to its last answer (a call that goes on from it), so the
        history is what was said since, and is introduced as such."""
        if not self.history:
            return self.text
        lines = [SINCE_LAST_ANSWER if since_last_answer else CONVERSATION_SO_FAR]
        lines += [f"[{entry.kind} {entry.key}] {entry.text}" for entry in self.history]
        lines += ["", "Current request:", self.text]
        return "\n".join(lines)


# --- updates ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextPreview:
    """Live answer text (not counted, not replayed). ``offset``: where ``text`` starts in the whole answer text
    (what `TextSet` will say), so a piece already shown is not shown twice; None: right after what is shown."""

    text: str
    offset: int | None = None
    kind: Literal["text_preview"] = "text_preview"
    durable: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class TextSet:
    """The authoritative answer text so far (replaces previews)."""

    text: str
    kind: Literal["text_set"] = "text_set"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ToolStarted:
    call_id: str
    name: str
    input: Any = None
    effect_kind: EffectKind = EffectKind.UNKNOWN
    idempotency: Idempotency = Idempotency.UNKNOWN
    kind: Literal["tool_started"] = "tool_started"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ToolFinished:
    call_id: str
    name: str
    status: ToolStatus
    output: str = ""
    kind: Literal["tool_finished"] = "tool_finished"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class GateOpened:
    """The harness waits for permission; answered with approve / always / deny."""

    gate_id: str
    prompt: str
    title: str = "Permission needed"
    kind: Literal["gate_opened"] = "gate_opened"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class GateResolved:
    gate_id: str
    answer: GateAnswer
    granted: bool
    timed_out: bool = False
    reason: str = ""
    kind: Literal["gate_resolved"] = "gate_resolved"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class QuestionAsked:
    """The harness asks the user a question mid-turn (its ask_user tool); answered with free text or a choice."""

    request_id: str
    question: str
    choices: tuple[str, ...] = ()
    kind: Literal["question_asked"] = "question_asked"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class QuestionClosed:
    """The question got its answer (``answer``), or its deadline passed first (``timed_out``)."""

    request_id: str
    answer: str = ""
    timed_out: bool = False
    kind: Literal["question_closed"] = "question_closed"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ModelCalled:
    """A model call the harness made (``action`` model_call, or compact for a history summary)."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    action: Literal["model_call", "compact"] = "model_call"
    recorded: RecordedCall | None = None
    """The full request and reply of each attempt behind it, when the adapter recorded them (the built-in one)."""
    kind: Literal["model_called"] = "model_called"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Finished:
    """The final answer: success."""

    content: Any
    format: Literal["text", "json"] = "text"
    kind: Literal["finished"] = "finished"
    durable: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Failed:
    """The execution ended without an answer."""

    code: str
    message: str
    phase: FailurePhase = "failed"
    recorded: tuple[RecordedCall, ...] = ()
    """Model calls that failed for good before it (every attempt), when the adapter recorded them."""
    kind: Literal["failed"] = "failed"
    durable: ClassVar[bool] = True


Update = (
    TextPreview
    | TextSet
    | ToolStarted
    | ToolFinished
    | GateOpened
    | GateResolved
    | QuestionAsked
    | QuestionClosed
    | ModelCalled
    | Finished
    | Failed
)
TERMINAL_UPDATES = (Finished, Failed)


def update_json(update: Update) -> dict[str, Any]:
    """The canonical JSON of an update (what the replay hash covers). A model call's ``recorded`` prompts are left
    out: a replay from the journal has none, and it must hash the same."""
    body: dict[str, Any] = {}
    for name in update.__dataclass_fields__:
        if name == "recorded":
            continue
        value = getattr(update, name)
        body[name] = str(value) if isinstance(value, EffectKind | Idempotency) else value
    return body


# --- the seam --------------------------------------------------------------------------------------------------


@runtime_checkable
class AnswersQuestions(Protocol):
    """A run whose harness can ask the user (`QuestionAsked`); the engine forwards the asker's answers here."""

    async def provide_user_input(self, request_id: str, text: str) -> None:
        """Answer the open question ``request_id`` (the first answer binds; a late one may be ignored)."""
        ...


class AdapterRun(Protocol):
    """One observed execution. ``updates()`` is iterated once; ``aclose`` stops observing (never cancels)."""

    @property
    def execution_ref(self) -> str | None:
        """Where the execution lives (a harness session id, …), stored with the call."""
        ...

    @property
    def replays(self) -> bool:
        """Whether this run (from ``resume``) replays the durable updates from the start.

        False means a resume re-runs the execution (a read effect): its updates are all new and every one of
        them is applied after the stored checkpoint.
        """
        ...

    def updates(self) -> AsyncIterator[Update]: ...

    async def answer_gate(self, gate_id: str, answer: GateAnswer) -> None:
        """Forward a gate answer (the first answer binds; a late or unknown gate may be ignored)."""
        ...

    async def cancel(self) -> None:
        """Ask the execution to stop (best effort)."""
        ...

    async def aclose(self) -> None:
        """Stop observing and release resources; a running execution stays resumable."""
        ...


@runtime_checkable
class InputCapable(Protocol):
    """A run that takes a user's follow-up while it works (the harness's queued-input rule)."""

    async def add_input(self, text: str, *, key: str) -> bool:
        """Queue ``text`` (follow-up ``key``, its input message id) into the running turn; False when the run
        cannot take it any more (its turn ended). Delivering the same ``key`` again is a no-op that says True."""
        ...


@runtime_checkable
class WorkspaceCapable(Protocol):
    """An adapter that can run a call in its own workspace with a tools profile (`AdapterRequest.workspace`,
    ``tools``); the engine refuses such calls for any other adapter."""

    @property
    def supports_workspaces(self) -> bool: ...


@runtime_checkable
class ForkCapable(Protocol):
    """An adapter that can start a call as a fork of an earlier harness session (`AdapterRequest.fork`); the
    engine refuses such calls for any other adapter."""

    @property
    def supports_forks(self) -> bool: ...


@runtime_checkable
class ForkPoints(Protocol):
    """An adapter that can say where to fork an earlier call's session to answer its input again."""

    async def fork_point(self, request: AdapterRequest, session_id: str) -> int: ...


@runtime_checkable
class EndPoints(Protocol):
    """An adapter that can say where an earlier call's session ended settled, so a new call can go on from it."""

    async def end_point(self, request: AdapterRequest, session_id: str) -> int | None: ...


def supports_forks(adapter: object) -> bool:
    """Whether ``adapter`` takes `AdapterRequest.fork`."""
    return isinstance(adapter, ForkCapable) and adapter.supports_forks


def supports_workspaces(adapter: object) -> bool:
    """Whether ``adapter`` takes `AdapterRequest.workspace` and ``tools``."""
    return isinstance(adapter, WorkspaceCapable) and adapter.supports_workspaces


class HarnessAdapter(Protocol):
    """A harness the engine can drive. ``start`` and ``resume`` must return promptly (before the execution ends)."""

    @property
    def supports_resume(self) -> bool: ...

    @property
    def effect(self) -> tuple[EffectKind, Idempotency]:
        """How the ledger classifies one execution of this adapter (fixed before it runs)."""
        ...

    async def start(self, request: AdapterRequest) -> AdapterRun: ...

    async def resume(self, request: AdapterRequest, execution_ref: str | None) -> AdapterRun:
        """Reattach to the execution of ``request.call_id`` (or start it if it provably never started)."""
        ...
