"""What `loopd run` shows: the model's answer on stdout, everything else (tools, gates, usage) on stderr.

Keeping the answer alone on stdout means ``loopd run "…" > answer.md`` captures just the answer while the
terminal still shows the rest. The view owns the cursor: it closes an unfinished answer line or question before
anything else is printed, and runs at most one spinner at a time (none when stderr is not a terminal). Text from
the model, tools or the user is always printed as plain text, never as Rich markup. While `holding_log_lines` is
open, a log record written on the view's thread in the middle of an answer waits for the answer's end (both go to
the same terminal: a warning must not split the answer's text).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final, TextIO

from rich.console import Console
from rich.panel import Panel
from rich.status import Status
from rich.text import Text

from loopd.harness import ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import (
    ContextMeasured,
    ContextPressure,
    GateOpened,
    GateResolved,
    ModelRetrying,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    UserInputRequested,
)
from loopd.harness.gate import GateAnswer, GatePrompt

DEMO_NOTE: Final = (
    "model: demo, a scripted stand-in that answers without an LLM (try “list files” or “read README.md”). "
    "For a real model set LOOPD_MODEL (e.g. gpt-4o-mini) and OPENAI_API_KEY, plus OPENAI_BASE_URL for another "
    "OpenAI-compatible provider (or pass --model / --base-url)."
)
PROMPT: Final = "you › "
CHARS_PER_TOKEN: Final = 4.0
"""A rough size of a token in characters, for estimating what a cut-short stream produced."""
GATE_QUESTION: Final = "[a]pprove once / a[l]ways / [d]eny › "
_STATUS_STYLES: Final = {"ok": "green", "error": "red", "denied": "yellow", "interrupted": "yellow", "unknown": "red"}
_STATUS_MARKS: Final = {"ok": "✓", "error": "✗", "denied": "⊘", "interrupted": "■", "unknown": "?"}
_MAX_HELD_RECORDS: Final = 100
"""Log records held back during one answer at most; later ones are written at once."""


def shorten(text: str, *, lines: int = 4, width: int = 160) -> str:
    """At most ``lines`` lines of at most ``width`` characters, saying how much was left out."""
    rows = text.strip("\n").splitlines() or [""]
    shown = [row if len(row) <= width else row[: width - 1] + "…" for row in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"… (+{len(rows) - lines} more lines)")
    return "\n".join(shown)


def describe_usage(usage: Usage) -> str:
    return (
        f"{usage.total_tokens:,} tokens ({usage.input_tokens:,} in / {usage.output_tokens:,} out) · "
        f"${usage.cost_usd:.4f}"
    )


def describe_context(measured: ContextMeasured) -> str:
    """The status-line part for a context measurement: its size, and its share of the window when known."""
    if measured.window:
        return f"context {measured.tokens:,}/{measured.window:,} tokens ({measured.tokens / measured.window:.0%})"
    return f"context {measured.tokens:,} tokens"


def describe_call(call: ToolCall) -> str:
    arguments = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items())
    return shorten(f"{call.name}({arguments})", lines=1, width=200)


def _unmetered(chars: int) -> str:
    """What a model call cut short mid-stream spent: the provider reports usage only at the end of a stream."""
    if chars <= 0:
        return ""
    return f" + a cut-short model call, usage unknown (~{max(1, round(chars / CHARS_PER_TOKEN)):,} tokens streamed)"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _wait(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m {seconds % 60:02d}s"


class RunView:
    """Renders one `loopd run` process: session lines, streamed answers, tool calls, gates, usage."""

    def __init__(self, *, console: Console, out: TextIO, resume_options: str = "") -> None:
        self._console = console
        self._out = out
        self._resume_options = resume_options
        self.model_url: str | None = None
        """The model's endpoint when it is not the provider's default (named when it cannot be reached)."""
        self._status: Status | None = None
        self._text_written = False
        self._text_at_line_start = True
        self._question_open = False
        self._held_logs: list[_HeldLogRecords] = []

    # --- the cursor ---------------------------------------------------------------------------------------

    def _break(self) -> None:
        """Stop the spinner and end an unfinished answer line or an unanswered question."""
        self.stop_spinner()
        if self._text_written and not self._text_at_line_start:
            self._out.write("\n")
            self._out.flush()
        self._text_written = False
        self._text_at_line_start = True
        if self._question_open:
            self._console.print()
            self._question_open = False
        for held in self._held_logs:
            held.release()

    @property
    def answering(self) -> bool:
        """Whether an answer is being written (its text started and nothing else has been printed since)."""
        return self._text_written

    @contextlib.contextmanager
    def holding_log_lines(self) -> Iterator[None]:
        """While open, log records written on this thread in the middle of an answer wait for its end.

        Each handler of the root logger gets a filter for the time of the block; what it still holds at the end
        is written then. Records from other threads are never held (the view is not thread-safe).
        """
        thread = threading.get_ident()
        guards = [(handler, _HeldLogRecords(self, handler, thread)) for handler in logging.getLogger().handlers]
        for handler, guard in guards:
            handler.addFilter(guard)
        self._held_logs = [guard for _, guard in guards]
        try:
            yield
        finally:
            self._held_logs = []
            for handler, guard in guards:
                handler.removeFilter(guard)
                guard.release()

    def _line(self, *parts: str | tuple[str, str] | Text) -> None:
        self._break()
        self._console.print(Text.assemble(*parts), soft_wrap=True)

    def _spin(self, message: str) -> None:
        if not self._console.is_terminal:
            return
        if self._status is None:
            self._status = self._console.status(Text(message, style="dim"), spinner="dots")
            self._status.start()
        else:
            self._status.update(Text(message, style="dim"))

    def stop_spinner(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._break()

    def resume_command(self, session_id: str) -> str:
        """The command that continues ``session_id`` (with ``--data-dir`` when it is not the default one)."""
        return f"loopd run --resume {session_id}{self._resume_options}"

    # --- session ------------------------------------------------------------------------------------------

    def session_opened(self, session_id: str, *, workspace: Path, model: str, journal: Path) -> None:
        self._line((f"session {session_id} · resume with: {self.resume_command(session_id)}", "bold"))
        self._line((f"workspace {workspace} · model {model} · journal {journal}", "dim"))

    def demo_note(self) -> None:
        self._line((DEMO_NOTE, "yellow"))

    def recap(self, *, turns: int, last_reply: str | None, usage: Usage, questions: int = 0) -> None:
        self._line(("resumed", "bold"), f" · {_plural(turns, 'turn')} so far · {describe_usage(usage)}")
        if last_reply:
            self._line(("last reply: ", "dim"), (shorten(last_reply, lines=6), "dim italic"))
        if questions:
            waiting = "a permission question is" if questions == 1 else f"{questions} permission questions are"
            self._line((f"{waiting} still waiting for an answer", "bold yellow"))

    def questions_left_open(self, session_id: str, count: int) -> None:
        """The run ends with unanswered questions: they stay open in the journal until their deadline."""
        waiting = "a permission question stays" if count == 1 else f"{count} permission questions stay"
        self._line((f"{waiting} open: {self.resume_command(session_id)} asks again", "yellow"))

    def repl_banner(self) -> None:
        self._line(("type a message · /exit or Ctrl-D quits · Ctrl-C interrupts a running turn", "dim"))

    def repl_help(self) -> None:
        self._line(
            (
                "Each line is one turn of this session. /exit, /quit or Ctrl-D quits; Ctrl-C interrupts a running "
                "turn (at the prompt: press it twice to quit). Permission questions take a, l or d; Ctrl-C twice "
                "there quits and leaves the question open for loopd run --resume. /diff shows what changed in the "
                "workspace since before the last turn; /undo puts it back. /mode plan (read-only tools) or "
                "/mode build, /model NAME and /loop NAME change the session's mode, model and active loop (alone: "
                "show them).",
                "dim",
            )
        )

    def session_closed(self, session_id: str, *, turns: int, usage: Usage, unmetered_chars: int = 0) -> None:
        self._line(
            f"session {session_id} · {_plural(turns, 'turn')} · {describe_usage(usage)}{_unmetered(unmetered_chars)}"
            f" · resume with: {self.resume_command(session_id)}"
        )

    def prompt(self) -> None:
        self._break()
        self._console.print(Text(PROMPT, style="bold cyan"), end="")
        self._question_open = True

    def echo_input(self, text: str) -> None:
        """Show a line read from a pipe (a terminal echoes what the user types by itself)."""
        self._line((PROMPT, "bold cyan"), text)

    def answered(self) -> None:
        """The user ended the open prompt line with Enter (the terminal echoed it)."""
        self._question_open = False

    def note(self, message: str) -> None:
        self._line((message, "dim"))

    def warning(self, message: str) -> None:
        self._line((message, "yellow"))

    def error(self, message: str) -> None:
        self._line(("error: ", "bold red"), message)

    # --- a turn -------------------------------------------------------------------------------------------

    def thinking(self) -> None:
        self._spin("thinking…")

    def text(self, piece: str) -> None:
        if not piece:
            return
        self.stop_spinner()
        if self._question_open:
            self._console.print()
            self._question_open = False
        self._out.write(piece)
        self._out.flush()
        self._text_written = True
        self._text_at_line_start = piece.endswith("\n")

    def tool_started(self, name: str, summary: str) -> None:
        self._line(("  ▸ ", "cyan"), (name, "bold"), f" {summary}" if summary else "")
        self._spin(f"running {name} {summary}…")

    def tool_progress(self, name: str, message: str) -> None:
        self._spin(f"{name}: {shorten(message, lines=1, width=100)}")

    def tool_completed(self, outcome: ToolOutcome) -> None:
        style = _STATUS_STYLES.get(outcome.status, "red")
        mark = _STATUS_MARKS.get(outcome.status, "?")
        head = f"  {mark} {outcome.name}"
        if outcome.status != "ok":
            head += f" {outcome.status}"
        body = shorten(outcome.output).replace("\n", "\n      ")
        self._line((head, style), " → ", (body, "dim"))
        self._spin("thinking…")

    def retrying(self, event: ModelRetrying) -> None:
        """One line per failed model attempt: who failed and why, and what happens next (a retry or the next model
        of the fallback chain)."""
        who = f"{event.model} ({event.provider})" if event.model and event.provider else event.model or "the model"
        status = f"{event.status_code} " if event.status_code is not None else ""
        why = f"{status}{shorten(event.error, lines=1)}".strip()
        if event.next == "fallback":
            self._line((f"  ↪ {who} failed ({why}); falling back to the next model of the chain", "yellow"))
            self._spin("trying the next model…")
            return
        wait = f" in {event.delay:.1f}s" if event.delay > 0 else ""
        self._line((f"  ↻ {who} attempt {event.attempt} failed ({why}); retrying{wait}", "dim"))
        self._spin("waiting to retry…")

    def gate_opened(self, event: GateOpened, calls: Mapping[str, ToolCall], *, now: float) -> None:
        prompt = GatePrompt.model_validate(event.prompt)
        body = Text()
        for call_id in event.call_ids:
            call = calls.get(call_id)
            body.append("  " + (describe_call(call) if call else call_id) + "\n", style="bold")
        body.append("needs:\n")
        for item in prompt.items:
            body.append(f"  • {item.description}", style="")
            body.append(f"  ({item.kind} {item.match})\n", style="dim")
        grants = prompt.grants
        if grants:
            body.append("a[l]ways stores for this workspace:\n")
            for grant in grants:
                body.append(f"  • allow {grant.kind} {grant.pattern}", style="")
                body.append(f"  ({grant.description})\n" if grant.description else "\n", style="dim")
        body.append(f"no answer within {_wait(event.deadline - now)} denies it", style="dim")
        self._break()
        self._console.print(Panel.fit(body, title="permission needed", title_align="left", border_style="yellow"))

    def gate_question(self) -> None:
        self._break()
        self._console.print(Text(GATE_QUESTION, style="bold yellow"), end="")
        self._question_open = True

    def question_kept(self, session_id: str) -> None:
        self._line(
            (
                f"  (Ctrl-C again to quit: the question stays open and {self.resume_command(session_id)} "
                "asks it again; d denies it)",
                "dim",
            )
        )

    def gate_invalid(self, line: str) -> None:
        self._line((f"  {line.strip()!r} is not an answer: type a (approve once), l (always) or d (deny)", "yellow"))

    def gate_unattended(self, answer: GateAnswer) -> None:
        self._line(
            (
                f"  stdin is not a terminal: answering with the policy's unattended answer ({answer.value}); "
                "set `unattended:` in a --policy file to change it",
                "yellow",
            )
        )

    def gate_resolved(self, event: GateResolved, *, rules_file: Path) -> None:
        if event.granted and event.answer == "approve_always":
            self._line(("  ✓ approved always", "green"), (f" · stored in {rules_file}", "dim"))
        elif event.granted:
            self._line(("  ✓ approved once", "green"))
        else:
            reason = "" if event.reason in ("", "deny") else f": {event.reason}"
            self._line((f"  ⊘ denied{reason}", "yellow"))
        self._spin("working…")

    def user_question(self, event: UserInputRequested, *, now: float, waiting: int = 0) -> None:
        """The model asks the user (ask_user): the question, its choices; the next line typed answers it.
        ``waiting``: how many more questions of the same step come after this one."""
        body = Text(event.question + "\n", style="bold")
        for number, choice in enumerate(event.choices, start=1):
            body.append(f"  {number}. {choice}\n")
        if event.choices:
            body.append("answer with a number or in your own words\n", style="dim")
        body.append(f"no answer within {_wait(event.deadline - now)} lets the model go on without one", style="dim")
        title = "the model asks" if not waiting else f"the model asks ({_plural(waiting, 'more question')} after this)"
        self._break()
        self._console.print(Panel.fit(body, title=title, title_align="left", border_style="cyan"))

    def user_question_prompt(self) -> None:
        self._break()
        self._console.print(Text("answer> ", style="bold cyan"), end="")
        self._question_open = True

    def interrupting(self) -> None:
        self._line(("  interrupting the turn… (Ctrl-C again to quit)", "yellow"))

    def turn_done(self, event: TurnDone, *, text_shown: bool, context: ContextMeasured | None = None) -> None:
        if not text_shown and event.text:
            self.text(event.text)
        shown = f" · {describe_context(context)}" if context is not None else ""
        self._line(
            ("  ✓ done", "green"), (f" · {_plural(event.step, 'step')} · {describe_usage(event.usage)}{shown}", "dim")
        )

    def context_pressure(self, event: ContextPressure) -> None:
        """The context passed the loop's pressure threshold: older messages will be compacted soon."""
        self._line((f"  ⚠ context {event.ratio:.0%} full ({event.tokens:,} of {event.limit:,} tokens)", "yellow"))

    def turn_failed(self, event: TurnFailed, *, unmetered_chars: int = 0) -> None:
        hint = ""
        if event.error_type.startswith("Model") and "connection failed" in event.message:
            where = f"the model server at {self.model_url}" if self.model_url else "the model provider"
            hint = f"; is {where} reachable? (OPENAI_BASE_URL / --base-url)"
        self._line(
            ("  ✗ turn failed: ", "bold red"),
            f"{event.error_type}: {event.message}{hint}",
            (f" · {describe_usage(event.usage)}{_unmetered(unmetered_chars)}", "dim"),
        )

    def turn_interrupted(self, event: TurnInterrupted, *, unmetered_chars: int = 0) -> None:
        self._line(
            ("  ■ interrupted", "yellow"),
            (f" ({event.reason}) · {describe_usage(event.usage)}{_unmetered(unmetered_chars)}", "dim"),
        )

    def input_dropped(self, kind: str, reason: str) -> None:
        self._line((f"  ■ the input was not run ({kind}: {reason})", "yellow"))


class _HeldLogRecords(logging.Filter):
    """On one log handler: holds back the records logged on the view's thread while it writes an answer.

    `release` hands them to the handler, in order; it never holds more than `_MAX_HELD_RECORDS` at a time.
    """

    def __init__(self, view: RunView, handler: logging.Handler, thread: int) -> None:
        super().__init__()
        self._view = view
        self._handler = handler
        self._thread = thread
        self._held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if threading.get_ident() != self._thread or not self._view.answering or len(self._held) >= _MAX_HELD_RECORDS:
            return True
        self._held.append(record)
        return False

    def release(self) -> None:
        held, self._held = self._held, []
        for record in held:
            self._handler.handle(record)
