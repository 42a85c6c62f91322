"""The Manager: its prompt (a function of the Run's stored state only) and the parser of its decision JSON.

The Manager has no tools. It reads the contract, the guidance, the last audit and the recent rounds, and answers one
JSON object::

    {"next": "cli" | "ask" | "blocked" | "done", "summary": "...", "plan": "...", "contract": "...",
     "question": "...", "choices": [{"value": "...", "label": "..."}], "allow_other": false}

Bounds: contract and plan ≤ 16,000 characters, question ≤ 4,000, summary ≤ 4,000, ≤ 20 choices (unique values,
labels ≤ 200). ``cli`` needs a plan; ``ask`` / ``blocked`` need a question. A Markdown fence or prose around the
object is tolerated; anything else invalid is a `ParseError` (the round fails; the Run never crashes on it).

Must not do: I/O, or import anything but this package's pure modules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from loopd.operators.longhorizon._errors import ParseError
from loopd.operators.longhorizon._phases import Choice, Decision, RunState

__all__ = [
    "MANAGER_FOOTER",
    "MANAGER_HEADER",
    "MAX_CHOICES",
    "MAX_CONTRACT",
    "MAX_QUESTION",
    "bounded_text",
    "json_object",
    "manager_prompt",
    "parse_decision",
]

MANAGER_HEADER: Final = "LongHorizon manager: decide the next step of a long task."
MANAGER_FOOTER: Final = "Answer with the JSON object only."
MAX_CONTRACT: Final = 16_000
MAX_QUESTION: Final = 4_000
MAX_SUMMARY: Final = 4_000
MAX_CHOICES: Final = 20
MAX_LABEL: Final = 200
_ROUNDS_SHOWN: Final = 8
_NEXT: Final = ("cli", "ask", "blocked", "done")


def json_object(text: str, *, what: str) -> dict[str, Any]:
    """The one JSON object of a model's answer: the whole text, a fenced block, or the span from the first ``{`` to
    the last ``}``. `ParseError` when there is none or it is not an object."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
        body = body.strip()
    if not body.startswith("{"):
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise ParseError(f"the {what} is not JSON: no object found", answer=text)
        body = body[start : end + 1]
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"the {what} is not valid JSON: {exc}", answer=text) from None
    if not isinstance(value, dict):
        raise ParseError(f"the {what} is not a JSON object", answer=text)
    return value


def bounded_text(value: Mapping[str, Any], name: str, limit: int, *, what: str, answer: str) -> str:
    raw = value.get(name)
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ParseError(f"the {what}'s {name!r} must be a string", answer=answer)
    if len(raw) > limit:
        raise ParseError(f"the {what}'s {name!r} has {len(raw)} characters; at most {limit}", answer=answer)
    return raw.strip()


def parse_decision(text: str) -> Decision:
    """The Manager's decision in ``text``, validated (see the module docstring); `ParseError` otherwise."""
    what = "decision"
    value = json_object(text, what=what)
    nxt = value.get("next")
    if nxt not in _NEXT:
        raise ParseError(f"the decision's 'next' must be one of {', '.join(_NEXT)}, not {nxt!r}", answer=text)
    plan = bounded_text(value, "plan", MAX_CONTRACT, what=what, answer=text)
    contract = bounded_text(value, "contract", MAX_CONTRACT, what=what, answer=text)
    question = bounded_text(value, "question", MAX_QUESTION, what=what, answer=text)
    summary = bounded_text(value, "summary", MAX_SUMMARY, what=what, answer=text)
    allow_other = value.get("allow_other", False)
    if not isinstance(allow_other, bool):
        raise ParseError("the decision's 'allow_other' must be true or false", answer=text)
    raw_choices = value.get("choices") or []
    if not isinstance(raw_choices, list):
        raise ParseError("the decision's 'choices' must be a list", answer=text)
    if len(raw_choices) > MAX_CHOICES:
        raise ParseError(f"the decision has {len(raw_choices)} choices; at most {MAX_CHOICES}", answer=text)
    choices: list[Choice] = []
    for raw in raw_choices:
        if isinstance(raw, str):
            raw = {"value": raw, "label": raw}
        if not isinstance(raw, dict):
            raise ParseError("each choice must be an object {value, label} or a string", answer=text)
        choice_value = bounded_text(raw, "value", MAX_LABEL, what="choice", answer=text)
        label = bounded_text(raw, "label", MAX_LABEL, what="choice", answer=text) or choice_value
        if not choice_value:
            raise ParseError("a choice has an empty value", answer=text)
        if any(c.value == choice_value for c in choices):
            raise ParseError(f"the choice {choice_value!r} is offered twice", answer=text)
        choices.append(Choice(choice_value, label))
    if nxt == "cli" and not plan:
        raise ParseError("the decision 'cli' needs a plan", answer=text)
    if nxt in ("ask", "blocked") and not question:
        raise ParseError(f"the decision {nxt!r} needs a question", answer=text)
    return Decision(
        next=nxt,
        summary=summary,
        plan=plan,
        contract=contract,
        question=question,
        choices=tuple(choices),
        allow_other=allow_other,
    )


def manager_prompt(state: RunState, *, goal: str, context: str = "") -> str:
    """The Manager's prompt for the Run's current round: built from the stored state only, so a restarted operator
    builds the same prompt (and re-attaches to the same call)."""
    lines = [
        MANAGER_HEADER,
        "",
        f"Round {state.round} of a budget of {state.budget}. Contract version {state.contract_version}.",
        "You lead an Executor (who works in a workspace with file tools and bash) and an Auditor (who reads the "
        "workspace and checks the Executor's work). Decide the next step.",
        "",
        "Goal:",
        goal.strip() or "(none)",
        "",
        "Contract (what counts as done; change it only when the goal or the guidance requires):",
        state.contract.strip() or "(none)",
    ]
    if context.strip():
        lines += ["", "Conversation before the goal:", context.strip()]
    if state.guidance.strip():
        lines += ["", "Guidance from the user:", state.guidance.strip()]
    if state.task_state.strip():
        lines += ["", "Task state (from the last audit):", state.task_state.strip()]
    last = state.last_audit
    if last is None:
        lines += ["", "Last audit: none valid for the current contract and guidance."]
    else:
        verdict = last.verdict
        lines += [
            "",
            f"Last audit (of execution {last.execution.name}, contract version {last.contract_version}): "
            f"complete={str(verdict.complete).lower()}, integrity={verdict.integrity}.",
        ]
        if verdict.evidence.strip():
            lines += ["Evidence:", verdict.evidence.strip()]
        if verdict.feedback.strip():
            lines += ["Feedback:", verdict.feedback.strip()]
    recent = state.rounds[-_ROUNDS_SHOWN:]
    if recent:
        lines += ["", "Recent rounds:"] + [f"- round {r.index} ({r.decision}): {r.summary}" for r in recent]
    lines += [
        "",
        "Answer one JSON object:",
        '{"next": "cli" | "ask" | "blocked" | "done", "summary": "one line for the user", '
        '"plan": "for cli: what the Executor does now", "contract": "the contract, if it must change", '
        '"question": "for ask/blocked: what to ask the user", "choices": [{"value": "...", "label": "..."}], '
        '"allow_other": false}',
        "- cli: the Executor carries out the plan, then the Auditor checks it.",
        "- ask / blocked: you need the user's answer to go on.",
        "- done: only when the last audit of the current contract version is complete and clean with evidence.",
        "",
        MANAGER_FOOTER,
    ]
    return "\n".join(lines)
