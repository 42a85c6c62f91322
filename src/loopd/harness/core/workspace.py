"""Workspace snapshots, the pure part: which checkpoints exist, which one the workspace is at, and what to restore.

A checkpoint is a content-addressed snapshot of the workspace (``loopd.harness.snapshots``) recorded by an enduring
session event, `WorkspaceCheckpointed`; `WorkspaceRestored` records that the workspace was put back to one. The
history is folded from the journal, so ``/undo`` keeps working after a restore of the session.

The history is a stack with a head: a checkpoint is appended and becomes the head; a restore moves the head to the
restored checkpoint (later checkpoints stay, so a restore can be undone by restoring a later one). ``undo`` restores
the newest checkpoint below the head that differs from it: the workspace as it was before the last turn that
changed it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from loopd.harness.core.events import (
    LoopEvent,
    StepDone,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    WorkspaceCheckpointed,
    WorkspaceRestored,
)

SnapshotTrigger = Literal["turn_done", "step_done", "idle", "off"]
SNAPSHOT_TRIGGERS: Final[tuple[str, ...]] = ("turn_done", "step_done", "idle", "off")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One recorded snapshot: its ref, why it was taken, and the turn it followed ("" when none)."""

    ref: str
    trigger: str
    loop: str
    turn_id: str


@dataclass(frozen=True, slots=True)
class WorkspaceHistory:
    """The session's checkpoints (oldest first) and the index of the one the workspace is at (-1: none)."""

    checkpoints: tuple[Checkpoint, ...] = ()
    head: int = -1

    @property
    def current(self) -> Checkpoint | None:
        return self.checkpoints[self.head] if self.head >= 0 else None


EMPTY_WORKSPACE_HISTORY: Final = WorkspaceHistory()


def apply_workspace(history: WorkspaceHistory, event: WorkspaceCheckpointed | WorkspaceRestored) -> WorkspaceHistory:
    """Fold one workspace event."""
    match event:
        case WorkspaceCheckpointed(ref=ref, trigger=trigger, loop=loop, turn_id=turn_id):
            checkpoints = (*history.checkpoints, Checkpoint(ref=ref, trigger=trigger, loop=loop, turn_id=turn_id))
            return WorkspaceHistory(checkpoints=checkpoints, head=len(checkpoints) - 1)
        case WorkspaceRestored(index=index):
            if not 0 <= index < len(history.checkpoints):
                return history  # a restore of a ref outside the list (e.g. a fork's): the head stays
            return WorkspaceHistory(checkpoints=history.checkpoints, head=index)
    raise TypeError(f"not a workspace event: {event!r}")  # pragma: no cover - the union is closed


def undo_target(history: WorkspaceHistory) -> tuple[int, Checkpoint] | None:
    """The checkpoint ``undo`` restores, or None when there is nothing to undo: the newest one below the head whose
    ref differs from the head's (a turn that changed no file is skipped: undoing it would change nothing)."""
    current = history.current
    for i in range(history.head - 1, -1, -1):
        if current is None or history.checkpoints[i].ref != current.ref:
            return i, history.checkpoints[i]
    return None


def index_of(history: WorkspaceHistory, ref: str) -> int:
    """The newest index of ``ref`` in the history, or -1."""
    for i in range(len(history.checkpoints) - 1, -1, -1):
        if history.checkpoints[i].ref == ref:
            return i
    return -1


def checkpoint_due(policy: SnapshotTrigger, events: Iterable[LoopEvent], *, loop_idle: bool) -> tuple[str, str] | None:
    """Whether committed ``events`` call for a checkpoint under ``policy``: (trigger, turn_id), or None.

    ``turn_done``: after every turn end (done, failed or interrupted); ``step_done``: after every step and every
    turn end; ``idle``: after a turn end that leaves the loop with nothing queued; ``off``: never. A turn's start
    also calls for one (except under ``off``), so the state before a turn is kept even when the user changed files
    between turns; the runtime skips recording it when the workspace has not changed since the head.
    """
    if policy == "off":
        return None
    due: tuple[str, str] | None = None
    for event in events:
        match event:
            case TurnStarted(turn_id=turn_id):
                due = ("turn_started", turn_id)
            case StepDone(turn_id=turn_id) if policy == "step_done":
                due = ("step_done", turn_id)
            case TurnDone(turn_id=turn_id) | TurnFailed(turn_id=turn_id) | TurnInterrupted(turn_id=turn_id):
                if policy != "idle" or loop_idle:
                    due = ("idle" if policy == "idle" else "turn_done", turn_id)
    return due


def referenced_refs(events: Iterable[object]) -> set[str]:
    """Every snapshot ref the events name (garbage collection keeps what any journal references)."""
    refs: set[str] = set()
    for event in events:
        if isinstance(event, WorkspaceCheckpointed | WorkspaceRestored):
            refs.add(event.ref)
    return refs
