"""Plans: what the planner call answers, parsed and checked (pure).

A plan is JSON ``{"kind": "simple" | "complex", "tasks": [...]}``, optionally inside a Markdown code fence:

- ``simple``: exactly one task (an empty or missing list means the request itself);
- ``complex``: at least two tasks and at most ``max_subtasks``;
- ``summary``: no tasks — the work so far answers the request; valid only when replanning after follow-ups.

Unknown fields are rejected, each task is trimmed and must not be empty. Anything else raises `PlanError` with a
message a user can read (it ends up in the Task's ``router_failed`` error).

Must not do: I/O of any kind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from loopd.operators.router._errors import PlanError

__all__ = ["PLAN_FIELDS", "Plan", "PlanKind", "parse_plan", "strip_fences"]

PlanKind = Literal["simple", "complex", "summary"]
PLAN_FIELDS: Final = ("kind", "tasks")
_FENCED: Final = re.compile(r"\A```[\w+-]*[ \t]*\n(?P<body>.*?)\n?[ \t]*```\Z", re.S)
_EXCERPT: Final = 120


@dataclass(frozen=True, slots=True)
class Plan:
    """A valid plan: its kind and its tasks (trimmed, non-empty; none for ``summary``)."""

    kind: PlanKind
    tasks: tuple[str, ...]


def strip_fences(text: str) -> str:
    """``text`` trimmed, without a Markdown code fence around all of it (```` ```json ... ``` ````)."""
    stripped = text.strip()
    if match := _FENCED.match(stripped):
        return match.group("body").strip()
    return stripped


def parse_plan(answer: str, *, request: str, max_subtasks: int, replan: bool = False) -> Plan:
    """The plan in the model's ``answer``; `PlanError` when it is not a valid plan.

    ``request`` is what a simple plan without tasks stands for; ``replan`` allows the ``summary`` kind.
    """

    def invalid(reason: str) -> PlanError:
        said = " ".join(answer.split())
        excerpt = said if len(said) <= _EXCERPT else said[:_EXCERPT] + "…"
        return PlanError(f"invalid plan: {reason} (the planner answered: {excerpt or '(nothing)'!r})", answer=answer)

    body = strip_fences(answer)
    try:
        data = json.loads(body)
    except ValueError as exc:
        detail = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        raise invalid(f"it is not JSON ({detail})") from None
    if not isinstance(data, dict):
        raise invalid(f"it must be a JSON object, not {_json_type(data)}")
    unknown = sorted(set(data) - set(PLAN_FIELDS))
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        raise invalid(f"unknown field{'s' if len(unknown) > 1 else ''} {names} (a plan has only kind and tasks)")
    kinds: tuple[PlanKind, ...] = ("simple", "complex", "summary") if replan else ("simple", "complex")
    kind = data.get("kind")
    if kind not in kinds:
        allowed = " or ".join(f'"{k}"' for k in kinds)
        if kind == "summary":
            raise invalid('kind "summary" is valid only when replanning after follow-ups')
        shown = "missing" if "kind" not in data else json.dumps(kind, ensure_ascii=False)
        raise invalid(f"kind must be {allowed}, not {shown}")
    tasks = _tasks(data.get("tasks", []), invalid)
    match kind:
        case "simple":
            if not tasks:
                if not request.strip():
                    raise invalid("a simple plan without tasks needs a non-empty request")
                return Plan("simple", (request.strip(),))
            if len(tasks) != 1:
                raise invalid(f"a simple plan has exactly one task, not {len(tasks)}")
            return Plan("simple", tasks)
        case "complex":
            if len(tasks) < 2:
                raise invalid(f"a complex plan needs at least 2 tasks, not {len(tasks)}")
            if len(tasks) > max_subtasks:
                raise invalid(f"the plan has {len(tasks)} tasks; at most {max_subtasks} are allowed")
            return Plan("complex", tasks)
        case _:
            if tasks:
                raise invalid(f"a summary plan has no tasks, not {len(tasks)}")
            return Plan("summary", ())


def _tasks(value: object, invalid: Callable[[str], PlanError]) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise invalid(f"tasks must be a list of strings, not {_json_type(value)}")
    tasks: list[str] = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, str):
            raise invalid(f"task {number} must be a string, not {_json_type(item)}")
        if not (text := item.strip()):
            raise invalid(f"task {number} is empty")
        tasks.append(text)
    return tuple(tasks)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
