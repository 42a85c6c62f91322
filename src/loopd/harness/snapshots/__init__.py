"""Workspace snapshots: a content-addressed object store, restore confined to the workspace, garbage collection.

`SnapshotStore` takes and restores snapshots of one workspace; `SnapshotPolicy` is the rig's option (where the
store lives, when a session checkpoints: ``turn_done``, ``step_done``, ``idle`` or ``off``); `collect_garbage`
deletes what no journal references (see `loopd.harness.core.workspace` for the pure part and the events).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from loopd.harness.core import codec
from loopd.harness.core.workspace import SNAPSHOT_TRIGGERS, SnapshotTrigger
from loopd.harness.snapshots._store import (
    DEFAULT_EXCLUDES,
    Change,
    SnapshotError,
    SnapshotResult,
    SnapshotStore,
    collect_garbage,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "SNAPSHOT_TRIGGERS",
    "Change",
    "SnapshotError",
    "SnapshotPolicy",
    "SnapshotResult",
    "SnapshotStore",
    "SnapshotTrigger",
    "collect_garbage",
    "collect_unreferenced",
    "workspace_is_empty",
]

if TYPE_CHECKING:
    from loopd.harness.journal import Journal

_EVERY_SESSION: Final = 1_000_000
_WORKSPACE_KINDS: Final = frozenset({"workspace_checkpointed", "workspace_restored", "workspace_forked"})


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """Where a rig keeps workspace snapshots (``root``) and when its sessions take one (``on``)."""

    root: Path
    on: SnapshotTrigger = "turn_done"
    excludes: frozenset[str] = field(default=DEFAULT_EXCLUDES)

    def __post_init__(self) -> None:
        if self.on not in SNAPSHOT_TRIGGERS:
            raise ValueError(f"snapshots: 'on' must be one of {', '.join(SNAPSHOT_TRIGGERS)}, not {self.on!r}")

    def store_for(self, workspace: Path) -> SnapshotStore:
        return SnapshotStore(self.root, workspace, excludes=self.excludes)


def workspace_is_empty(directory: Path, excludes: frozenset[str] = DEFAULT_EXCLUDES) -> bool:
    """Whether ``directory`` is missing or holds nothing a snapshot would cover (names in ``excludes`` aside): a
    place a fork may restore its parent's snapshot into without overwriting anything (blocking: run off the loop)."""
    try:
        return all(entry.name in excludes for entry in directory.iterdir())
    except FileNotFoundError:
        return True


async def collect_unreferenced(
    journal: Journal, root: Path, *, grace_seconds: float = 3600.0, timeout: float = 600.0
) -> tuple[int, int]:
    """Delete the snapshot objects under ``root`` that no session of ``journal`` references; (deleted, bytes).

    Reachability: every ref named by a `WorkspaceCheckpointed` / `WorkspaceRestored` event of any session, and
    everything its trees reach. Objects younger than ``grace_seconds`` are kept (a snapshot being recorded now).
    Several journals sharing one store: call `collect_garbage` with the union of their refs instead.
    """
    async with asyncio.timeout(timeout):
        live: set[str] = set()
        for info in await journal.sessions(limit=_EVERY_SESSION):
            for record in await journal.read(info.session_id):
                if record.kind in _WORKSPACE_KINDS:
                    event = codec.decode(record.kind, record.version, record.data)
                    live.add(event.ref)  # type: ignore[union-attr]  # both kinds carry a ref
        return await asyncio.to_thread(collect_garbage, root, live, grace_seconds=grace_seconds)
