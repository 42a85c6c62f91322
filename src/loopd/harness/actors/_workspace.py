"""A session's workspace snapshots at run time: checkpoint on the rig's trigger, restore, undo, diff.

The pure part (the history folded from `WorkspaceCheckpointed` / `WorkspaceRestored`, when a checkpoint is due,
what undo restores) is `loopd.harness.core.workspace`; the store is `loopd.harness.snapshots`. A snapshot is
stored first and journaled second (a crash in between leaves objects nobody references: garbage collection takes
them); a restore requires every loop to be idle (nothing may write the workspace meanwhile) and is journaled once
the files are back.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from loopd.harness._errors import ForkWorkspaceError, HarnessError
from loopd.harness.core.events import LoopEvent, WorkspaceCheckpointed, WorkspaceRestored
from loopd.harness.core.workspace import (
    EMPTY_WORKSPACE_HISTORY,
    SnapshotTrigger,
    WorkspaceEvent,
    WorkspaceHistory,
    apply_workspace,
    checkpoint_due,
    index_of,
    undo_target,
)
from loopd.harness.snapshots import SnapshotError, SnapshotStore

if TYPE_CHECKING:
    from loopd.harness.actors._loop import LoopActor
    from loopd.harness.actors._session import Session

_log = logging.getLogger(__name__)
_SETTLE_TIMEOUT = 600.0


class NothingToUndoError(HarnessError):
    """``undo`` found no checkpoint before the current one."""


class WorkspaceBusyError(HarnessError):
    """The workspace cannot be restored while a turn runs (interrupt it first)."""


class SessionWorkspace:
    """The snapshots of one session's workspace (reached as ``session.workspace``)."""

    def __init__(
        self,
        session: Session,
        store: SnapshotStore | None,
        on: SnapshotTrigger,
        history: WorkspaceHistory = EMPTY_WORKSPACE_HISTORY,
    ) -> None:
        self._session = session
        self.store = store
        self.on: SnapshotTrigger = on if store is not None else "off"
        self.history = history
        self._taking = 0  # checkpoints `after_commit` is taking now (a turn end's snapshot, not yet journaled)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def _require(self) -> SnapshotStore:
        if self.store is None:
            raise HarnessError("workspace snapshots are off for this rig (give it a workspace and a SnapshotPolicy)")
        return self.store

    def apply(self, event: WorkspaceEvent) -> None:
        """Runtime: fold a committed workspace event (called under the session's commit lock)."""
        self.history = apply_workspace(self.history, event)

    async def after_commit(self, actor: LoopActor, events: tuple[LoopEvent, ...]) -> None:
        """Runtime: take the checkpoint the rig's trigger calls for after ``events`` (a failure is logged, not
        raised: a turn does not fail because its snapshot could not be taken)."""
        if self.store is None or self.on == "off":
            return
        due = checkpoint_due(self.on, events, loop_idle=actor.state.idle)
        if due is None:
            return
        trigger, turn_id = due
        self._taking += 1
        try:
            await self.checkpoint(trigger=trigger, loop=actor.name, turn_id=turn_id)
        except (SnapshotError, OSError) as exc:
            _log.warning("workspace snapshot after %s of %s failed: %s", trigger, turn_id, exc)
        finally:
            self._taking -= 1
            self._session.notify_changed()

    async def checkpoints_taken(self, timeout: float = _SETTLE_TIMEOUT) -> None:
        """Return once no checkpoint the trigger called for is still being taken. A turn's end is visible (its
        loop idle, its ``turns`` counted) just before the snapshot that follows it is journaled; a fork from "after
        that turn" waits here so it finds that snapshot. Does not wait for running turns."""
        await self._session.wait_until(lambda: self._taking == 0, timeout=timeout)

    async def checkpoint(self, *, trigger: str = "manual", loop: str = "", turn_id: str = "") -> str:
        """Snapshot the workspace and record it; its ref. A turn-start snapshot equal to the head is not recorded."""
        store = self._require()
        result = await store.checkpoint()
        head = self.history.current
        if trigger == "turn_started" and head is not None and head.ref == result.ref:
            return result.ref
        await self._session.commit_session(
            WorkspaceCheckpointed(
                ref=result.ref,
                trigger=trigger,
                loop=loop,
                turn_id=turn_id,
                files=result.files,
                bytes_new=result.bytes_new,
                at=self._session.clock.time(),
            )
        )
        return result.ref

    async def restore(self, ref: str, *, reason: str = "restore", index: int | None = None) -> None:
        """Put the workspace back to snapshot ``ref`` (checkpoint ``index``: default, the newest with that ref) and
        record it. Refused while a turn runs."""
        store = self._require()
        self._session.check_accepting()
        await self._settle()
        head = self.history.current
        await store.restore(ref)
        await self._session.commit_session(
            WorkspaceRestored(
                ref=ref,
                index=index_of(self.history, ref) if index is None else index,
                previous_ref=head.ref if head is not None else None,
                reason=reason,
                at=self._session.clock.time(),
            )
        )

    async def finish_fork(self) -> None:
        """Restore: put the workspace back to the parent's snapshot a fork journaled (`WorkspaceForked`) and did not
        finish, then record `WorkspaceRestored` (reason ``fork``). Nothing runs yet, so nothing else writes there.

        `ForkWorkspaceError` when this rig cannot do it: no snapshot store, or another workspace directory than
        the one the fork recorded (the files would land in the wrong place)."""
        ref = self.history.pending_fork
        if ref is None:
            return
        if self.store is None:
            raise ForkWorkspaceError(
                f"session {self._session.id} must restore its workspace from snapshot {ref[:12]}, "
                "but this rig takes no snapshots"
            )
        if self.history.directory and Path(self.history.directory) != self.store.workspace:
            raise ForkWorkspaceError(
                f"session {self._session.id} works in {self.history.directory}, not {self.store.workspace}: "
                "restore it with a rig on that directory"
            )
        await asyncio.to_thread(self.store.workspace.mkdir, mode=0o700, parents=True, exist_ok=True)  # private
        await self.store.restore(ref)
        await self._session.commit_session(
            WorkspaceRestored(
                ref=ref, index=self.history.head, previous_ref=None, reason="fork", at=self._session.clock.time()
            )
        )

    async def _settle(self) -> None:
        """Refuse while a turn runs; otherwise let the checkpoint that follows the last turn end finish."""
        if not all(a.state.idle for a in self._session.running_actors()):
            raise WorkspaceBusyError("a turn is running: interrupt it (or wait) before restoring the workspace")
        await self._session.wait_idle(timeout=_SETTLE_TIMEOUT)

    async def undo(self) -> str:
        """Restore the workspace as it was before the last turn that changed it; the snapshot's ref."""
        self._require()
        await self._settle()  # the checkpoint after the last turn's end is in the history
        target = undo_target(self.history)
        if target is None:
            raise NothingToUndoError("nothing to undo: no earlier workspace snapshot differs from the current one")
        index, checkpoint = target
        await self.restore(checkpoint.ref, reason="undo", index=index)
        return checkpoint.ref

    async def diff(self) -> str:
        """What the workspace changed since the checkpoint ``undo`` would restore (a unified diff; "" if none)."""
        store = self._require()
        await self._settle()
        target = undo_target(self.history)
        base = target[1].ref if target is not None else (self.history.current.ref if self.history.current else None)
        if base is None:
            return ""
        now = await store.checkpoint()
        return await store.diff(base, now.ref)
