"""Reports: what each role did in a round, streamed into the Task's work conversation before the status moves on.

A report is one output of the Task keyed like the step's harness call (``<runUID>/round/<n>/<role>``), opened with
its whole text as one AgentUE model (``biz`` ``loopd.longhorizon``, ``meta.author`` =
``operator/longhorizon/<role>``, ``meta.role``, ``meta.round``, ``meta.run``; one text block), then ended. Outputs
are idempotent by key: a re-run gets the same output back and, when the earlier run stopped before the end, sends
only the end; an ended report is never written again. Only after the end lands does the operator write the Run's
status, so a report is never lost and never repeated.

Must not do: decide anything, or import loopd.server / loopd.harness.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from loopd.agentue import Model
from loopd.runtime import Runtime

__all__ = ["AUTHOR_PREFIX", "BIZ", "Role", "author_of", "report", "report_content"]

BIZ: Final = "loopd.longhorizon"
AUTHOR_PREFIX: Final = "operator/longhorizon/"
REPORT_BLOCK: Final = "text"
MAX_REPORT: Final = 16_000
Role = Literal["manager", "executor", "auditor"]
_TITLES: Final = {"manager": "Manager", "executor": "Executor", "auditor": "Auditor"}


def author_of(role: Role) -> str:
    """The author a report of ``role`` names: ``operator/longhorizon/<role>``."""
    return AUTHOR_PREFIX + role


def report_title(role: Role, round_: int) -> str:
    """The report's title, e.g. ``Manager · round 2``."""
    return f"{_TITLES[role]} · round {round_}"


def report_content(role: Role, round_: int, run: str, text: str) -> dict[str, Any]:
    """The AgentUE model (as JSON) of a report."""
    body = text if len(text) <= MAX_REPORT else text[: MAX_REPORT - 1] + "…"
    model = Model(
        biz=BIZ,
        meta={"author": author_of(role), "role": role, "round": round_, "run": run},
        blocks=[{"id": REPORT_BLOCK, "type": "text", "content": body or "(empty)"}],
    )
    return model.to_json()


async def report(rt: Runtime, task_id: str, key: str, *, role: Role, round_: int, run: str, text: str) -> str:
    """Open (or find) the report ``key`` and end it if it has not ended; its message id."""
    output = await rt.chat.tell(
        task_id, key, title=report_title(role, round_), content=report_content(role, round_, run, text)
    )
    if output.message.status == "streaming":
        await output.end()
    return output.id
