"""Demo rules: the demo model's answers to the Router's own prompts, so `loopd up` without an LLM routes for real.

`demo_rules` returns plain functions ``(current request text) -> answer text | None`` — the shape of the demo model's
``DemoRule`` seam (``loopd.harness.models``), which the process that builds the harness passes in; the Router never
imports the harness. Each rule recognises one prompt by its header (`_prompts`) and answers deterministically:

- plan: a request that names a list ("Introduce Liu Bei, Guan Yu, and Zhang Fei") becomes a complex plan with one
  task per item (when there are 2..max of them); anything else a simple plan. A replan plans one task per follow-up;
- work: an answer that names the task's subject and says it is the demo model's stand-in;
- summarize: an answer that combines every piece of evidence and names each subject.

Must not do: I/O of any kind, or import loopd.harness (operators reach the harness only through loop-server).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Final

from loopd.operators.router._prompts import (
    PLAN_FOOTER,
    PLAN_HEADER,
    REPLAN_HEADER,
    SUMMARIZE_HEADER,
    WORK_HEADER,
)

__all__ = ["DemoAnswer", "demo_rules", "list_items", "subject_of"]

DemoAnswer = Callable[[str], str | None]
"""A demo reply rule: the current request's text → the answer, or None when the rule does not apply."""

_LEAD: Final = re.compile(
    r"^\s*(?P<lead>introduce|describe|tell me about|who (?:are|were|is|was)|what (?:are|is)|explain|"
    r"summari[sz]e|research|write about|compare|look up)\s+(?P<rest>.+?)[\s.?!]*$",
    re.I | re.S,
)
_SEPARATORS: Final = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|&)\s+", re.I)
_MAX_SUBTASKS: Final = re.compile(r"\(complex: 2 to (\d+) tasks\)")
_EVIDENCE: Final = re.compile(r"^\[(\d+)\] Task: (?P<task>.*)\nResult: ", re.M)
_MAX_ITEM_WORDS: Final = 8
_NOTE: Final = "(This is the demo model's stand-in answer: set LOOPD_MODEL to a real model for a real one.)"


def list_items(request: str) -> tuple[str, tuple[str, ...]] | None:
    """``(lead, items)`` when ``request`` is a lead verb followed by a list of 2+ short items, else None."""
    match = _LEAD.match(request)
    if match is None:
        return None
    items = tuple(i.strip(" .?!\"'") for i in _SEPARATORS.split(match.group("rest").strip()))
    if len(items) < 2 or any(not i or len(i.split()) > _MAX_ITEM_WORDS or "\n" in i for i in items):
        return None
    return match.group("lead"), items


def subject_of(task: str) -> str:
    """What a task is about: the task without its lead verb ("Introduce Liu Bei" → "Liu Bei")."""
    if match := _LEAD.match(task):
        return match.group("rest").strip(" .?!\"'")
    return task.strip()


def _task_for(lead: str, item: str) -> str:
    lowered = lead.lower()
    if lowered.startswith("who "):
        return f"Who is {item}?"
    if lowered.startswith("what "):
        return f"What is {item}?"
    if lowered == "compare":
        return f"Describe {item}"
    return f"{lead[0].upper()}{lead[1:]} {item}"


def _section(text: str, label: str, *, end: str | None = None) -> str:
    """The body of the first ``label`` section: from its line to ``end`` (or to the end of ``text``)."""
    head = f"\n{label}\n"
    start = text.find(head)
    if start < 0:
        return ""
    body = text[start + len(head) :]
    if end is not None and (stop := body.find(end)) >= 0:
        body = body[:stop]
    return body.strip()


def _items(section: str) -> list[str]:
    """The ``- item`` entries of a section (continuation lines joined)."""
    items: list[str] = []
    for line in section.splitlines():
        if line.startswith("- "):
            items.append(line[2:].strip())
        elif line.startswith("  ") and items:
            items[-1] += " " + line.strip()
    return [i for i in items if i]


def _plan(text: str) -> str | None:
    replan = text.startswith(REPLAN_HEADER)
    if not (replan or text.startswith(PLAN_HEADER)):
        return None
    found = _MAX_SUBTASKS.search(text)
    max_subtasks = int(found.group(1)) if found else 2
    footer = f"\n\n{PLAN_FOOTER}"
    if replan:
        followups = _items(_section(text, "Follow-ups from the user:", end=footer))
        if not followups:
            return json.dumps({"kind": "summary", "tasks": []})
        if 2 <= len(followups) <= max_subtasks:
            return json.dumps({"kind": "complex", "tasks": followups})
        return json.dumps({"kind": "simple", "tasks": [" ".join(followups)]})
    request = _section(text, "Request:", end=footer)
    listed = list_items(request)
    if listed is not None and len(listed[1]) <= max_subtasks:
        lead, items = listed
        return json.dumps({"kind": "complex", "tasks": [_task_for(lead, item) for item in items]})
    return json.dumps({"kind": "simple", "tasks": [request]})


def _work(text: str) -> str | None:
    if not text.startswith(WORK_HEADER):
        return None
    task = _section(text, "Task:") or "the task"
    subject = subject_of(task)
    return (
        f"{subject}: the demo model cannot research “{task}”, so this stands in for the answer about {subject}. {_NOTE}"
    )


def _summarize(text: str) -> str | None:
    if not text.startswith(SUMMARIZE_HEADER):
        return None
    evidence = text[text.find("\nEvidence:\n") + 1 :] if "\nEvidence:\n" in text else ""
    entries = list(_EVIDENCE.finditer(evidence))
    if not entries:
        return f"There was nothing to combine. {_NOTE}"
    pieces: list[tuple[str, str]] = []
    for index, entry in enumerate(entries):
        end = entries[index + 1].start() if index + 1 < len(entries) else len(evidence)
        result = " ".join(evidence[entry.end() : end].split())
        pieces.append((subject_of(entry.group("task")), result))
    if len(pieces) == 1:
        return f"{pieces[0][1]}"
    names = [s for s, _ in pieces]
    joined = ", ".join(names[:-1]) + f", and {names[-1]}" if len(names) > 2 else " and ".join(names)
    lines = [f"Here is what I have on {joined}:", ""]
    lines += [f"- **{subject}**: {result}" for subject, result in pieces]
    lines += ["", "(The demo model put these results side by side; a real model would write one fluent answer.)"]
    return "\n".join(lines)


def demo_rules() -> tuple[DemoAnswer, ...]:
    """The demo model's rules for the Router's prompts (plan/replan, work, summarize), to be tried before its own."""
    return (_plan, _work, _summarize)
