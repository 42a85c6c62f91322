"""The Router's prompts (pure): plan, replan, work and summarize, built from the Task's durable facts only.

Every prompt is a function of what is stored — the request, the conversation before it, the follow-ups, the results
of finished calls — so a restarted Router builds the same text and re-attaches to the same harness call (the engine
refuses the same effect key with other parameters).

Layout: a header line saying the job, instructions, then labelled sections (``Conversation so far:``,
``Request:`` / ``Original request:``, ``Follow-ups from the user:``, ``Work done so far:``, ``Task:``,
``Evidence:``). History lines are ``kind/key: text`` (continuation lines indented by two spaces), or
``(no earlier messages)``. Evidence entries are ``[i] Task: …`` then ``Result: …``. The summarize prompt says
nothing about routing, plans or subtasks, so the answer does not either.

Must not do: I/O of any kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = [
    "EARLIER_OMITTED",
    "NO_HISTORY",
    "PLAN_FOOTER",
    "PLAN_HEADER",
    "REPLAN_HEADER",
    "SUMMARIZE_HEADER",
    "WORK_HEADER",
    "Evidence",
    "Said",
    "evidence_text",
    "history_text",
    "plan_prompt",
    "replan_prompt",
    "summarize_prompt",
    "work_prompt",
]

NO_HISTORY: Final = "(no earlier messages)"
EARLIER_OMITTED: Final = "(earlier messages omitted)"
PLAN_HEADER: Final = "You plan how to answer a user's request."
REPLAN_HEADER: Final = "You replan how to answer a user's request: the user added to it while the work was running."
PLAN_FOOTER: Final = "Answer with the JSON object only: no prose, no code fence."
WORK_HEADER: Final = "You carry out one task that is part of answering a user's request."
SUMMARIZE_HEADER: Final = "You write the answer to a user's request from the evidence gathered for it."


class Said(Protocol):
    """A message as the prompts see it (the runtime's ``Message`` is one)."""

    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def text(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Evidence:
    """One finished task and what it found."""

    task: str
    result: str


def _indented(text: str) -> str:
    """``text`` trimmed, its later lines indented by two spaces (so each entry starts a line of its own)."""
    return "\n  ".join(text.strip().splitlines())


def history_text(messages: Iterable[Said], *, has_earlier: bool = False) -> str:
    """The conversation before the request: one ``kind/key: text`` entry per message with text."""
    lines = [f"{m.kind}/{m.key}: {_indented(m.text)}" for m in messages if m.text.strip()]
    if not lines:
        return NO_HISTORY
    return "\n".join([EARLIER_OMITTED, *lines] if has_earlier else lines)


def _followups(followups: Sequence[str]) -> str:
    return "\n".join(f"- {_indented(f)}" for f in followups)


def evidence_text(evidence: Sequence[Evidence]) -> str:
    """``[i] Task: …`` / ``Result: …`` entries, numbered from 1, separated by a blank line."""
    return "\n\n".join(f"[{i}] Task: {e.task.strip()}\nResult: {e.result.strip()}" for i, e in enumerate(evidence, 1))


def _plan_rules(max_subtasks: int) -> list[str]:
    return [
        "Decide whether one assistant can answer the request directly (simple), or whether it splits into "
        f"independent parts that assistants can work on in parallel (complex: 2 to {max_subtasks} tasks).",
        'Answer with JSON of exactly this shape: {"kind": "simple" | "complex", "tasks": ["...", ...]}',
        '- "simple": "tasks" holds exactly one task, the request itself (restated so it stands alone).',
        f'- "complex": "tasks" holds 2 to {max_subtasks} tasks, each self-contained: it must make sense without '
        "the others and without the conversation.",
        "Split only when the parts are really independent; otherwise answer simple.",
    ]


def plan_prompt(request: str, history: str, *, max_subtasks: int) -> str:
    """The first planner prompt: classify the request and split it into tasks; JSON only."""
    return "\n".join(
        [
            PLAN_HEADER,
            *_plan_rules(max_subtasks),
            "",
            "Conversation so far:",
            history,
            "",
            "Request:",
            request.strip(),
            "",
            PLAN_FOOTER,
        ]
    )


def replan_prompt(
    request: str, history: str, *, max_subtasks: int, evidence: Sequence[Evidence], followups: Sequence[str]
) -> str:
    """The planner prompt after follow-ups: the request, the work done so far, then what the user added."""
    return "\n".join(
        [
            REPLAN_HEADER,
            *_plan_rules(max_subtasks),
            "Plan only the work still needed. If the work done so far already answers the request and the "
            'follow-ups, answer {"kind": "summary", "tasks": []}.',
            "",
            "Conversation so far:",
            history,
            "",
            "Request:",
            request.strip(),
            "",
            "Work done so far:",
            evidence_text(evidence) or "(none)",
            "",
            "Follow-ups from the user:",
            _followups(followups),
            "",
            PLAN_FOOTER,
        ]
    )


def work_prompt(request: str, history: str, task: str, *, followups: Sequence[str] = ()) -> str:
    """A worker prompt: the conversation, the original request (and follow-ups), then the one task to do."""
    lines = [
        WORK_HEADER,
        "Do only this task and answer with its result: complete, self-contained and ready to be combined with the "
        "results of other tasks.",
        "",
        "Conversation so far:",
        history,
        "",
        "Original request:",
        request.strip(),
    ]
    if followups:
        lines += ["", "Follow-ups from the user:", _followups(followups)]
    return "\n".join([*lines, "", "Task:", task.strip()])


def summarize_prompt(request: str, history: str, evidence: Sequence[Evidence], *, followups: Sequence[str] = ()) -> str:
    """The final prompt: answer the request from the evidence, speaking to the user directly."""
    lines = [
        SUMMARIZE_HEADER,
        "Answer the user directly and completely, using the evidence. Do not mention the evidence, its numbering or "
        "how it was gathered.",
        "",
        "Conversation so far:",
        history,
        "",
        "Request:",
        request.strip(),
    ]
    if followups:
        lines += ["", "Follow-ups from the user:", _followups(followups)]
    return "\n".join([*lines, "", "Evidence:", evidence_text(evidence)])
