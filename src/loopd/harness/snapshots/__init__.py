"""Workspace snapshots: a content-addressed object store, restore confined to the workspace, garbage collection.

`SnapshotStore` takes and restores snapshots of one workspace; `SnapshotPolicy` is the rig's option (where the
store lives, when a session checkpoints: ``turn_done``, ``step_done``, ``idle`` or ``off``); `collect_garbage`
deletes what no journal references (see `loopd.harness.core.workspace` for the pure part and the events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
]


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
