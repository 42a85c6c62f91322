"""Demo rules that bend the scripted path, chosen by a marker at the end of the goal (so one server runs many).

Markers (in the goal, e.g. "Create hello.txt containing hello world [wrong-once]"; every role's prompt holds the
goal or the contract): ``[wrong-once]`` the Executor writes the wrong content in round 1; ``[wrong-always]`` in every
round; ``[early-done]`` the Manager says done in round 2 (before any complete audit); ``[new-contract]`` the Manager
says done in round 4 with a changed contract; ``[ask]`` the Manager asks the user in round 1; ``[ask-r2]`` in round 2;
``[junk]`` the Manager never answers JSON. Anything else falls through to `demo_rules()`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from loopd.operators.longhorizon import EXECUTOR_HEADER, MANAGER_HEADER, demo_rules
from loopd.runtime import Message

__all__ = ["QUESTION", "reports", "scenario_rules"]

QUESTION: Final = "Which greeting should the file hold?"
_TOOLS: Final = "Tool results so far:"
_ROUND: Final = re.compile(r"^Round (\d+)\b", re.M)
_PLAN_FILE: Final = re.compile(r"^Write file: (.+)$", re.M)


def _round(text: str) -> int:
    found = _ROUND.search(text)
    return int(found.group(1)) if found else 0


def _executor(text: str) -> str | Mapping[str, Any] | None:
    if not text.startswith(EXECUTOR_HEADER) or _TOOLS in text:
        return None
    wrong = "[wrong-always]" in text or ("[wrong-once]" in text and _round(text) == 1)
    if not wrong:
        return None
    path = _PLAN_FILE.search(text)
    return {"tool": "write_file", "arguments": {"path": path.group(1) if path else "x.txt", "content": "nope\n"}}


def _manager(text: str) -> str | None:
    if not text.startswith(MANAGER_HEADER):
        return None
    n = _round(text)
    if "[junk]" in text:
        return "I think we should keep going."
    if "[early-done]" in text and n == 2:
        return json.dumps({"next": "done", "summary": "Looks finished to me."})
    if "[new-contract]" in text and n == 4:
        contract = "Create hello.txt containing hello world, and nothing else [new-contract]"
        return json.dumps({"next": "done", "summary": "Done, with a stricter contract.", "contract": contract})
    if ("[ask]" in text and n == 1) or ("[ask-r2]" in text and n == 2):
        return json.dumps(
            {
                "next": "ask",
                "question": QUESTION,
                "choices": [{"value": "hello", "label": "hello"}, {"value": "hi", "label": "hi"}],
                "allow_other": True,
            }
        )
    return None


def scenario_rules() -> tuple[Any, ...]:
    """The scenario rules first, then the demo's own."""
    return (_manager, _executor, *demo_rules())


def reports(messages: list[Message]) -> list[tuple[str, int]]:
    """``(role, round)`` of every LongHorizon report among ``messages``, in order."""
    return [
        (str(m.content["meta"]["role"]), int(m.content["meta"]["round"]))
        for m in messages
        if m.content.get("biz") == "loopd.longhorizon"
    ]
