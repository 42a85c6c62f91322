"""Progress messages: what the Router says when follow-ups arrive, and how a restarted Router reads its rounds back.

When the user adds follow-ups while the work runs, the Router speaks ``progress/<round>`` in the Task's main
conversation before it replans. The message's content carries the round and the ids of the follow-ups it covers
(``meta``: ``phase``, ``round``, ``followup_ids``, ``through_id``; one ``progress`` block). These messages are the
durable record of the round boundaries: `recover_rounds` reads them back from the Task's messages, so a restarted
Router replays the same rounds with the same follow-ups, builds the same prompts and re-attaches to the same calls.

Must not do: I/O of any kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from loopd.agentue import Model

__all__ = [
    "BIZ",
    "PROGRESS_BLOCK",
    "PROGRESS_PHASE",
    "ProgressMark",
    "Written",
    "progress_content",
    "progress_key",
    "progress_text",
    "recover_rounds",
]

BIZ: Final = "loopd.router"
PROGRESS_PHASE: Final = "progress"
PROGRESS_BLOCK: Final = "progress"


class Written(Protocol):
    """A stored message as recovery reads it (the runtime's ``Message`` is one)."""

    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def content(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class ProgressMark:
    """A round boundary: round ``round`` (≥ 1) began because of the follow-ups ``followup_ids``."""

    round: int
    followup_ids: tuple[str, ...]


def progress_key(round_: int) -> str:
    """The output key of the progress message that opens ``round_``."""
    return f"progress/{round_}"


def progress_text(followups: int) -> str:
    """What the progress message says."""
    if followups == 1:
        return "Noted your follow-up: replanning the work to include it."
    return f"Noted your {followups} follow-ups: replanning the work to include them."


def progress_content(round_: int, followup_ids: Sequence[str]) -> dict[str, Any]:
    """The AgentUE model (as JSON) of the progress message opening ``round_`` for ``followup_ids``."""
    if round_ < 1 or not followup_ids:
        raise ValueError("a progress message opens a round ≥ 1 for at least one follow-up")
    through = followup_ids[-1]
    model = Model(
        biz=BIZ,
        meta={"phase": PROGRESS_PHASE, "round": round_, "followup_ids": list(followup_ids), "through_id": through},
        blocks=[
            {
                "id": PROGRESS_BLOCK,
                "type": "progress",
                "content": progress_text(len(followup_ids)),
                "through_id": through,
            }
        ],
    )
    return model.to_json()


def recover_rounds(messages: Iterable[Written], *, kind: str, key: str) -> tuple[ProgressMark, ...]:
    """The round boundaries recorded by progress messages of ``kind/key``: rounds 1, 2, … without a gap.

    A message that is not such a progress message is ignored; a round after a missing one is ignored too (it cannot
    exist: a round's progress message is spoken only after the one before it).
    """
    found: dict[int, tuple[str, ...]] = {}
    for message in messages:
        if message.kind != kind or message.key != key:
            continue
        meta = (message.content or {}).get("meta")
        if not isinstance(meta, Mapping) or meta.get("phase") != PROGRESS_PHASE:
            continue
        round_, ids = meta.get("round"), meta.get("followup_ids")
        if not isinstance(round_, int) or isinstance(round_, bool):
            continue
        if isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids):
            found.setdefault(round_, tuple(ids))
    marks: list[ProgressMark] = []
    while (len(marks) + 1) in found:
        marks.append(ProgressMark(len(marks) + 1, found[len(marks) + 1]))
    return tuple(marks)
