"""Demo rules: the demo model's scripted but honest answers to the three roles' prompts.

`demo_rules` returns plain functions ``(current request text) -> answer | None`` — the demo model's ``DemoRule``
seam, which the process that builds the harness passes in (the operator never imports the harness). An answer is a
text, or a mapping ``{"tool": name, "arguments": {...}}`` that makes the demo model call that tool; after a tool
result the rule is called again with the request followed by ``"Tool results so far:"`` and the results. Each rule
recognises its role's prompt by its header line:

- Manager: with no valid audit of the current contract version, a goal like "Create hello.txt containing hello
  world" becomes ``cli`` with a plan ``Write file: hello.txt`` / ``Content: hello world`` (any other goal: a plan to
  write ``goal.md`` holding the goal, since the demo cannot do real work); after a complete, clean audit of this
  contract version: ``done``; after an incomplete or stale one: the same plan again.
- Executor: calls ``write_file`` with the plan's path and content, then reports what the tool answered.
- Auditor: calls ``read_file`` on the plan's path, then gives a verdict from what it really read: complete and
  clean with the file's text as evidence when the content is there, incomplete with feedback otherwise.

Must not do: I/O of any kind, or import loopd.harness.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from loopd.operators.longhorizon._auditor import AUDITOR_HEADER
from loopd.operators.longhorizon._executor import EXECUTOR_HEADER
from loopd.operators.longhorizon._manager import MANAGER_HEADER

__all__ = ["DemoAnswer", "demo_rules", "file_task"]

DemoAnswer = Callable[[str], "str | Mapping[str, Any] | None"]
"""A demo reply rule: the current request's text → a text, a tool call ``{"tool", "arguments"}``, or None."""

TOOL_RESULTS: Final = "\n\nTool results so far:\n"
_FILE_GOAL: Final = re.compile(
    r"^\s*(?:please\s+)?(?:create|write|make|add)\s+(?:a\s+|the\s+)?(?:file\s+(?:named\s+|called\s+)?)?"
    r"[`'\"]?(?P<path>[\w][\w./-]*\.\w+)[`'\"]?\s+"
    r"(?:containing|that\s+contains|with(?:\s+the)?(?:\s+(?:content|contents|text))?)[:\s]+"
    r"[`'\"]?(?P<content>.+?)[`'\"]?\s*[.!]?\s*$",
    re.I | re.S,
)
_PLAN_FILE: Final = re.compile(r"^Write file: (?P<path>.+)$", re.M)
_PLAN_CONTENT: Final = re.compile(r"^Content: (?P<content>.*)$", re.M)
_CONTRACT_VERSION: Final = re.compile(r"^Round \d+ of a budget of \d+\. Contract version (\d+)\.$", re.M)
_AUDITED_VERSION: Final = re.compile(r"^Last audit \(of execution \S+, contract version (\d+)\)", re.M)
_NOTE: Final = "(The demo model scripted this step; set LOOPD_MODEL to a real model for real work.)"


def file_task(goal: str) -> tuple[str, str]:
    """``(path, content)`` the demo writes for ``goal``: the file a "create X containing Y" goal names, else
    ``goal.md`` holding the goal itself."""
    match = _FILE_GOAL.match(goal)
    if match is not None and ".." not in match.group("path") and not match.group("path").startswith("/"):
        return match.group("path"), match.group("content").strip()
    return "goal.md", " ".join(goal.split())[:2000] or "(empty goal)"


def _section(text: str, label: str) -> str:
    """The body of the ``label`` section: from its line to the next blank line."""
    head = f"\n{label}\n"
    start = text.find(head)
    if start < 0:
        return ""
    body = text[start + len(head) :]
    stop = body.find("\n\n")
    return (body[:stop] if stop >= 0 else body).strip()


def _split(text: str) -> tuple[str, str | None]:
    """The prompt and the tool results after it (None before any tool ran)."""
    at = text.find(TOOL_RESULTS)
    if at < 0:
        return text, None
    return text[:at], text[at + len(TOOL_RESULTS) :]


def _plan_file(prompt: str) -> tuple[str, str] | None:
    path, content = _PLAN_FILE.search(prompt), _PLAN_CONTENT.search(prompt)
    if path is None or content is None:
        return None
    return path.group("path").strip(), content.group("content").strip()


def _manager(text: str) -> str | None:
    if not text.startswith(MANAGER_HEADER):
        return None
    goal = _section(text, "Goal:")
    path, content = file_task(goal)
    plan = f"Write file: {path}\nContent: {content}"
    version = _CONTRACT_VERSION.search(text)
    audited = _AUDITED_VERSION.search(text)
    fresh = version is not None and audited is not None and version.group(1) == audited.group(1)
    if fresh and "complete=true, integrity=clean." in text:
        return json.dumps(
            {
                "next": "done",
                "summary": f"{path} contains “{content}”: the Executor wrote it and the Auditor read it back. {_NOTE}",
            }
        )
    summary = f"Write {path} containing “{content}”."
    if "\nLast audit (of execution" in text:
        summary = f"The last audit found the work incomplete; write {path} again."
    return json.dumps({"next": "cli", "summary": summary, "plan": plan})


def _executor(text: str) -> str | Mapping[str, Any] | None:
    if not text.startswith(EXECUTOR_HEADER):
        return None
    prompt, results = _split(text)
    wanted = _plan_file(prompt)
    if wanted is None:
        return f"The plan names no file to write, so I did nothing. {_NOTE}"
    path, content = wanted
    if results is None:
        return {"tool": "write_file", "arguments": {"path": path, "content": content + "\n"}}
    said = " ".join(results.split())[:500]
    return f"I called write_file for {path}. The tool answered: {said} {_NOTE}"


def _auditor(text: str) -> str | Mapping[str, Any] | None:
    if not text.startswith(AUDITOR_HEADER):
        return None
    prompt, results = _split(text)
    wanted = _plan_file(prompt)
    if wanted is None:
        verdict = {
            "complete": False,
            "integrity": "unknown",
            "task_state": "No file to check.",
            "evidence": "",
            "feedback": "The plan named no file, so there is nothing to check.",
        }
        return json.dumps(verdict)
    path, content = wanted
    if results is None:
        return {"tool": "read_file", "arguments": {"path": path}}
    read = results.strip()
    if content and content in read:
        verdict = {
            "complete": True,
            "integrity": "clean",
            "task_state": f"{path} exists and contains “{content}”.",
            "evidence": f"read_file {path} returned: {' '.join(read.split())[:500]}",
            "feedback": "",
        }
    else:
        verdict = {
            "complete": False,
            "integrity": "clean",
            "task_state": f"{path} does not contain “{content}” yet.",
            "evidence": f"read_file {path} returned: {' '.join(read.split())[:500]}",
            "feedback": f"Write {path} with the content “{content}”.",
        }
    return json.dumps(verdict)


def demo_rules() -> tuple[DemoAnswer, ...]:
    """The demo model's rules for the Manager's, the Executor's and the Auditor's prompts."""
    return (_manager, _executor, _auditor)
