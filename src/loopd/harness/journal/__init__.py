"""Journal seam and implementations (SQLite with group commit, in-memory with fault injection)."""

from loopd.harness.journal._memory import MemoryJournal
from loopd.harness.journal._protocol import Journal, JournalWriter, NewRecord, Record, SessionInfo
from loopd.harness.journal._sqlite import SqliteJournal

__all__ = ["Journal", "JournalWriter", "MemoryJournal", "NewRecord", "Record", "SessionInfo", "SqliteJournal"]
