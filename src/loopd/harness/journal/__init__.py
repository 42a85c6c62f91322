"""Journal seam and implementations (SQLite and PostgreSQL with group commit, in-memory with fault injection).

``PostgresJournal`` needs the optional 'postgres' extra, so it is imported only when first asked for.
"""

from typing import TYPE_CHECKING, Any

from loopd.harness.journal._memory import MemoryJournal
from loopd.harness.journal._protocol import Journal, JournalWriter, NewRecord, Record, SessionInfo, Snapshot
from loopd.harness.journal._replay import last_settled_seq, replay, unsettled_loops
from loopd.harness.journal._snapshots import (
    DEFAULT_SNAPSHOT_EVERY,
    RESTORE_FOLD_SNAPSHOT,
    RestoredState,
    StateSnapshots,
    collector_paused,
    restore_state,
    snapshot_due,
)
from loopd.harness.journal._sqlite import SqliteJournal

if TYPE_CHECKING:
    from loopd.harness.journal._postgres import PostgresJournal

__all__ = [
    "DEFAULT_SNAPSHOT_EVERY",
    "RESTORE_FOLD_SNAPSHOT",
    "Journal",
    "JournalWriter",
    "MemoryJournal",
    "NewRecord",
    "PostgresJournal",
    "Record",
    "RestoredState",
    "SessionInfo",
    "Snapshot",
    "SqliteJournal",
    "StateSnapshots",
    "collector_paused",
    "last_settled_seq",
    "replay",
    "restore_state",
    "snapshot_due",
    "unsettled_loops",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresJournal":
        from loopd.harness.journal._postgres import PostgresJournal

        return PostgresJournal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
