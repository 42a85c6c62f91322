"""Workspace snapshots, the pure part: which checkpoints exist, which one the workspace is at, and what to restore.

A checkpoint is a content-addressed snapshot of the workspace (``loopd.harness.snapshots``) recorded by an enduring
session event, `WorkspaceCheckpointed`; `WorkspaceRestored` records that the workspace was put back to one. The
history is folded from the journal, so ``/undo`` keeps working after a restore of the session.

The history is a stack with a head: a checkpoint is appended and becomes the head; a restore moves the head to the
restored checkpoint (later checkpoints stay, so a restore can be undone by restoring a later one). ``undo`` restores
the newest checkpoint below the head that differs from it: the workspace as it was before the last turn that
changed it.

A fork can start from its parent's snapshot (`fork_checkpoint` finds it, `decide_fork_workspace` decides): the fork
journals `WorkspaceForked` before writing any file and `WorkspaceRestored` (reason ``fork``) once the files are back;
`pending_fork` says a restore of the session must finish it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from loopd.harness._errors import ForkWorkspaceError
from loopd.harness.core.events import (
    LoopEvent,
    StepDone,
    TurnDone,
    TurnFailed,
    TurnInterrupted,
    TurnStarted,
    WorkspaceCheckpointed,
    WorkspaceForked,
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
    """The session's checkpoints (oldest first) and the index of the one the workspace is at (-1: none).

    ``directory``: the workspace a fork restored its parent's snapshot into ("" when the session never did);
    ``pending_fork``: the ref of that restore while it is journaled but not finished (None otherwise)."""

    checkpoints: tuple[Checkpoint, ...] = ()
    head: int = -1
    directory: str = ""
    pending_fork: str | None = None

    @property
    def current(self) -> Checkpoint | None:
        return self.checkpoints[self.head] if self.head >= 0 else None


EMPTY_WORKSPACE_HISTORY: Final = WorkspaceHistory()


WorkspaceEvent = WorkspaceCheckpointed | WorkspaceRestored | WorkspaceForked


def apply_workspace(history: WorkspaceHistory, event: WorkspaceEvent) -> WorkspaceHistory:
    """Fold one workspace event."""
    match event:
        case WorkspaceCheckpointed(ref=ref, trigger=trigger, loop=loop, turn_id=turn_id):
            checkpoints = (*history.checkpoints, Checkpoint(ref=ref, trigger=trigger, loop=loop, turn_id=turn_id))
            return replace(history, checkpoints=checkpoints, head=len(checkpoints) - 1)
        case WorkspaceRestored(index=index):
            if not 0 <= index < len(history.checkpoints):
                return replace(history, pending_fork=None)  # a ref outside the list: the head stays
            return replace(history, head=index, pending_fork=None)
        case WorkspaceForked(ref=ref, directory=directory):
            # The parent's snapshot becomes the fork's newest checkpoint (so /undo goes back from it).
            checkpoints = (*history.checkpoints, Checkpoint(ref=ref, trigger="fork", loop="", turn_id=""))
            return WorkspaceHistory(
                checkpoints=checkpoints, head=len(checkpoints) - 1, directory=directory, pending_fork=ref
            )
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
        if isinstance(event, WorkspaceCheckpointed | WorkspaceRestored | WorkspaceForked):
            refs.add(event.ref)
    return refs


# --- forks -----------------------------------------------------------------------------------------------------

ForkWorkspace = Literal["keep", "new", "overwrite"]
"""What a fork does with its workspace: ``keep`` it as it is now (no restore), restore the parent's snapshot into
a ``new`` (empty) directory, or ``overwrite`` the rig's workspace with it (asked for explicitly)."""
FORK_WORKSPACES: Final[tuple[str, ...]] = ("keep", "new", "overwrite")
_TURN_END_TRIGGERS: Final = frozenset({"turn_done", "step_done", "idle"})


def fork_checkpoint(events: Sequence[tuple[int, object]], at_seq: int) -> tuple[int, str] | None:
    """The snapshot the parent's workspace was at after seq ``at_seq``: (the seq that recorded it, its ref), or None.

    ``events`` are the parent's (seq, event) pairs from seq 1, through ``at_seq`` and possibly beyond. The answer
    is the checkpoint the workspace was at after ``at_seq`` (the newest recorded or restored at or before it),
    except that the snapshot taken right after the turn that ended at or before ``at_seq`` counts too: a turn end's
    checkpoint is journaled just after the turn's terminal event, so forking "after the last turn" means it. Failing
    that, the snapshot the next turn took as it started (journaled just after its `TurnStarted`) counts: it is the
    workspace that turn found, so a fork just before a turn (loop-server's "retry from here") starts from the files
    the original turn saw. Past ``at_seq``, the search stops at a second turn start, the next turn's first step or
    end, or any other workspace event.
    """
    found: tuple[int, str] | None = None
    last_ended = ""
    next_turn = ""
    for seq, event in events:
        if seq <= at_seq:
            match event:
                case WorkspaceCheckpointed(ref=ref) | WorkspaceRestored(ref=ref) | WorkspaceForked(ref=ref):
                    found = (seq, ref)
                case TurnDone(turn_id=tid) | TurnFailed(turn_id=tid) | TurnInterrupted(turn_id=tid):
                    last_ended = tid
            continue
        match event:
            case WorkspaceCheckpointed(ref=ref, trigger=trigger, turn_id=tid):
                if not next_turn and last_ended and tid == last_ended and trigger in _TURN_END_TRIGGERS:
                    return seq, ref
                if next_turn and tid == next_turn and trigger == "turn_started":
                    return seq, ref
                break
            case TurnStarted(turn_id=tid) if not next_turn:
                next_turn = tid
            case TurnStarted() | WorkspaceRestored() | WorkspaceForked():
                break
            case (
                StepDone(turn_id=tid) | TurnDone(turn_id=tid) | TurnFailed(turn_id=tid) | TurnInterrupted(turn_id=tid)
            ) if next_turn and tid == next_turn:
                break
    return found


def decide_fork_workspace(
    mode: ForkWorkspace,
    checkpoint: tuple[int, str] | None,
    *,
    parent_id: str,
    parent_seq: int,
    directory: str,
    directory_empty: bool,
    snapshots: bool,
    now: float,
) -> WorkspaceForked | None:
    """What a fork at ``parent_seq`` does with its workspace ``directory``: None (``keep``: nothing), or the
    `WorkspaceForked` to journal before restoring ``checkpoint`` (see `fork_checkpoint`) there.

    `ForkWorkspaceError` when it cannot be done as asked: the rig takes no snapshots, the parent has no snapshot
    at or before the fork point, or a ``new`` directory is not empty (a fork never overwrites files unasked).
    """
    if mode == "keep":
        return None
    if mode not in FORK_WORKSPACES:
        raise ForkWorkspaceError(f"unknown fork workspace {mode!r}: use one of {', '.join(FORK_WORKSPACES)}")
    if not snapshots:
        raise ForkWorkspaceError("this rig takes no workspace snapshots: a fork can only keep the workspace as it is")
    if checkpoint is None:
        raise ForkWorkspaceError(
            f"session {parent_id!r} has no workspace snapshot at or before seq {parent_seq} "
            "(its snapshots were off): fork it keeping the workspace as it is"
        )
    if mode == "new" and not directory_empty:
        raise ForkWorkspaceError(
            f"{directory} is not empty: a fork's own workspace must be a new (or empty) directory; "
            "restoring over existing files must be asked for (overwrite)"
        )
    checkpoint_seq, ref = checkpoint
    return WorkspaceForked(
        ref=ref,
        parent_id=parent_id,
        parent_seq=parent_seq,
        checkpoint_seq=checkpoint_seq,
        directory=directory,
        overwrite=mode == "overwrite",
        at=now,
    )


def pending_fork(history: WorkspaceHistory) -> str | None:
    """The ref a fork journaled to restore and did not finish (a crash in between): the restore redoes it."""
    return history.pending_fork
