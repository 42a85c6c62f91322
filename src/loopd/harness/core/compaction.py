"""Context compaction, the pure part: when to compact, where to cut, and what the summarizer reads.

Past ``compact_at_tokens`` (estimated context size) and before the next model call, the oldest part of a loop's
history is replaced by a summary the model writes; the most recent ``keep_recent`` messages stay verbatim. The cut
never separates a tool result from the assistant message that asked for it (providers reject orphan tool results).

The estimate is what the provider reported for the last call (prompt + completion tokens) plus about four
characters per token for every message added since; after a compaction it restarts from the new history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from loopd.harness.core._values import Message, ToolCall, Usage
from loopd.harness.core.events import ContextMeasured, ContextPressure
from loopd.harness.core.state import LoopState

CHARS_PER_TOKEN: Final = 4
SUMMARY_PREFIX: Final = "Summary of the conversation so far (older messages were compacted):\n\n"

SUMMARIZER_PROMPT: Final = (
    "You compact an agent's conversation history. Write a faithful summary that lets the agent continue the work: "
    "the user's goals and constraints, decisions made, files and commands touched with their results, open "
    "questions and the next steps. Keep exact names, paths, numbers and error messages. Do not invent anything. "
    "Answer with the summary only."
)


def message_chars(message: Message) -> int:
    size = len(message.content)
    for call in message.tool_calls:
        size += len(call.name) + len(str(call.arguments))
    return size


def estimate_context(state: LoopState) -> int:
    """Estimated tokens the next model call will send (history only; the system prompt and tools are extra)."""
    added = sum(message_chars(m) for m in state.history[state.context_mark :])
    return state.context_tokens + added // CHARS_PER_TOKEN


def cut_point(history: Sequence[Message], keep_recent: int) -> int:
    """How many leading messages a compaction replaces (0: nothing worth compacting)."""
    cut = len(history) - max(keep_recent, 1)
    while cut > 0 and history[cut].role == "tool":
        cut -= 1
    return cut if cut >= 2 else 0


def should_compact(state: LoopState, *, threshold: int | None, keep_recent: int) -> int:
    """The cut point if the loop should compact before its next model call, else 0."""
    if threshold is None or estimate_context(state) < threshold:
        return 0
    return cut_point(state.history, keep_recent)


COMPACT_AT_WINDOW: Final = 0.85
"""With a declared context window and no ``compact_at_tokens``, compaction starts at this share of the window."""


def compact_threshold(compact_at_tokens: int | None, context_window: int | None) -> int | None:
    """The context size at which a loop compacts: its own threshold, else a share of its context window."""
    if compact_at_tokens is not None:
        return compact_at_tokens
    return int(context_window * COMPACT_AT_WINDOW) if context_window else None


def measure_context(state: LoopState, text: str, calls: Sequence[ToolCall], usage: Usage) -> int:
    """The context size after a model call (what `ContextMeasured` records): prompt + completion tokens as the
    provider reported them, or — from a provider that reports none — the estimate for the history plus the reply."""
    reported = usage.input_tokens + usage.output_tokens
    if reported:
        return reported
    reply = len(text) + sum(len(c.name) + len(str(c.arguments)) for c in calls)
    return estimate_context(state) + reply // CHARS_PER_TOKEN


def pressure_limit(compact_at_tokens: int | None, context_window: int | None) -> int | None:
    """What the context is measured against for `ContextPressure`: the window, else the compaction threshold."""
    return context_window or compact_at_tokens


def context_pressure(
    measured: ContextMeasured, *, limit: int | None, pressure_at: float, previous_tokens: int = 0
) -> ContextPressure | None:
    """The `ContextPressure` to publish after ``measured``, when it crosses ``pressure_at`` of ``limit``: it reaches
    the threshold and the measurement before it (``previous_tokens``, the loop's last `ContextMeasured`; 0 when
    none) did not. Once per crossing, not on every measurement past it: after a compaction brings the context below
    the threshold, the next crossing is reported again."""
    if not limit:
        return None
    ratio = measured.tokens / limit
    if ratio < pressure_at or previous_tokens / limit >= pressure_at:
        return None
    return ContextPressure(
        loop=measured.loop, turn_id=measured.turn_id, tokens=measured.tokens, limit=limit, ratio=round(ratio, 4)
    )


def render_transcript(messages: Sequence[Message]) -> str:
    """The history prefix as plain text for the summarizer (no provider-specific tool-call structure)."""
    lines: list[str] = []
    for m in messages:
        if m.role == "tool":
            lines.append(f"[tool result {m.name or ''} {m.tool_call_id or ''}]\n{m.content}")
            continue
        text = m.content
        for call in m.tool_calls:
            text += f"\n[calls tool {call.name} {call.arguments}]"
        lines.append(f"[{m.role}]\n{text}")
    return "\n\n".join(lines)


def summary_message(summary: str) -> Message:
    return Message(role="user", content=SUMMARY_PREFIX + summary)


BLOCK_AT_WINDOW: Final = 0.95
"""With a declared context window, a turn waits for its compaction from this share of the window."""


def must_wait(state: LoopState, *, threshold: int | None, block_at: int | None, context_window: int | None) -> bool:
    """Whether the turn waits for its compaction (blocking lane) instead of going on while it runs (background).

    A compaction past ``threshold`` runs on the background lane: the next call goes out with the full history and
    the summary replaces the prefix when it is ready. Only once the estimate reaches ``block_at`` — by default
    `BLOCK_AT_WINDOW` of the context window, or twice the threshold without a window: the next call might not
    fit — does the turn wait for the summary before calling the model.
    """
    if threshold is None:
        return True
    if block_at is not None:
        limit = block_at
    elif context_window:
        limit = max(threshold, int(context_window * BLOCK_AT_WINDOW))
    else:
        limit = 2 * threshold
    return estimate_context(state) >= limit
