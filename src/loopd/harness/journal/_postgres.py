"""PostgreSQL journal: group commit, epoch fencing in the database, LISTEN/NOTIFY for followers.

Owns: ``PostgresJournal``, its schema (steps 1-3 of the floor's migrator, recorded in ``journal_migrations`` inside
the journal's PostgreSQL schema; a schema versioned by its ``journal_meta`` row alone, as before the migrator, is
adopted) and the journal's statements. The pool, timeouts and the translation of psycopg failures into
`JournalError` are the floor's (``loopd._infra.postgres``). Must not import ``loopd.resources`` or
``loopd.server`` (the harness sits below them).

Writes: appends from every session of this process are gathered while the previous batch commits and are
written together by one call of the ``journal_append`` function, one statement and so one transaction (group
commit in a single round trip). It locks the rows of the sessions it touches (in sid order, so replicas cannot
deadlock) and compares each append's epoch with the stored one: a writer fenced by ``open_writer`` on *any*
replica fails with `JournalFencedError` and stores nothing, because ``open_writer`` bumps the epoch under the
same row lock. A statement that fails fails every append of its batch (fail-closed, as in the SQLite journal).

Reads and followers use pooled connections. A committed transaction sends ``pg_notify`` with the internal ids
of the sessions it extended; one listening connection per journal wakes the local followers of those sessions,
and followers also poll, so a lost notification only costs latency.

Every database call runs under ``timeout`` seconds on the client (``asyncio.timeout``, pool checkout included);
the server's ``statement_timeout`` and ``lock_timeout`` are set a little shorter, so that normally the server
aborts a slow statement cleanly (its transaction rolled back, nothing stored) before the client gives up. An
append is answered within ``2 * timeout``: the batch in flight ahead of it, then its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock, wait_event
from loopd._infra.database import Connection, DatabaseErrors
from loopd._infra.migrations import Migration, Schema, migrate
from loopd._infra.tasks import cancel_and_wait
from loopd.harness._errors import (
    ForkPointError,
    JournalCorruptError,
    JournalError,
    JournalFencedError,
    SessionBusyError,
    SessionNotFoundError,
    SnapshotSeqError,
)
from loopd.harness.journal._protocol import JournalWriter, NewRecord, Record, SessionInfo, Snapshot, SyncedOnReturn

try:
    import psycopg
    from psycopg import sql
    from psycopg.rows import TupleRow

    from loopd._infra.postgres import PostgresDatabase, PostgresOptions
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("PostgresJournal needs the 'postgres' extra: pip install 'pyloopd[postgres]'") from exc

_log = logging.getLogger(__name__)
_LISTEN_RETRY = Backoff(base=0.2, factor=2.0, max_delay=5.0)

SCHEMA_VERSION = 1
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_NOTIFY_ALL = "*"
_SID_CACHE = 8_192
_FOLLOW_PAGE = 512

_Connection = psycopg.AsyncConnection[TupleRow]

_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"

# Step 1, in one transaction (so: all of them or none). The journal_meta row tells builds from before the
# migrator which version this is.
_OBJECTS = (
    """CREATE TABLE IF NOT EXISTS {schema}.journal_meta (
        key text PRIMARY KEY,
        value text NOT NULL
    )""",
    """CREATE TABLE {schema}.journal_sessions (
        sid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id text NOT NULL UNIQUE,
        created_at double precision NOT NULL,
        last_seq bigint NOT NULL DEFAULT 0,
        epoch bigint NOT NULL DEFAULT 1,
        meta text NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX journal_sessions_created ON {schema}.journal_sessions (created_at DESC, sid DESC)",
    """CREATE TABLE {schema}.journal_records (
        sid bigint NOT NULL,
        seq bigint NOT NULL,
        kind text NOT NULL,
        v integer NOT NULL,
        at double precision NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (sid, seq)
    )""",
    # One group commit in one statement (one round trip, one implicit transaction). The rows of the batch's
    # sessions are locked first, in sid order, so replicas never deadlock, and an ``open_writer`` elsewhere (which
    # bumps the epoch under the same lock) lands wholly before or after. Per append: if the stored epoch is no
    # longer the writer's, it is fenced (0 in the result) and stores nothing; otherwise its records take the next
    # seqs of its session. The loop only does arithmetic; rows are written by one INSERT and one UPDATE.
    """CREATE FUNCTION {schema}.journal_append(
        p_sid bigint[], p_epoch bigint[], p_count integer[],
        r_kind text[], r_v integer[], r_at double precision[], r_data bytea[], p_channel text
    ) RETURNS bigint[] LANGUAGE plpgsql AS $fn$
    DECLARE
        n integer := coalesce(array_length(p_sid, 1), 0);
        h_sid bigint[];
        h_epoch bigint[];
        h_last bigint[];
        firsts bigint[] := array_fill(0::bigint, ARRAY[n]);
        offsets integer[] := array_fill(0, ARRAY[n]);
        pos integer := 0;
        j integer;
        payload text;
    BEGIN
        SELECT array_agg(sid), array_agg(epoch), array_agg(last_seq) INTO h_sid, h_epoch, h_last
          FROM (SELECT sid, epoch, last_seq FROM {schema}.journal_sessions
                 WHERE sid = ANY(p_sid) ORDER BY sid FOR UPDATE) AS locked;
        FOR i IN 1 .. n LOOP
            j := array_position(h_sid, p_sid[i]);
            IF j IS NOT NULL AND h_epoch[j] = p_epoch[i] THEN
                firsts[i] := h_last[j] + 1;
                h_last[j] := h_last[j] + p_count[i];
            END IF;
            offsets[i] := pos;
            pos := pos + p_count[i];
        END LOOP;
        INSERT INTO {schema}.journal_records (sid, seq, kind, v, at, data)
        SELECT a.sid, a.first + k - 1, r_kind[a.off + k], r_v[a.off + k], r_at[a.off + k], r_data[a.off + k]
          FROM unnest(p_sid, firsts, p_count, offsets) AS a(sid, first, cnt, off), generate_series(1, a.cnt) AS k
         WHERE a.first > 0;
        IF NOT FOUND THEN
            RETURN firsts;
        END IF;
        UPDATE {schema}.journal_sessions AS s SET last_seq = h.last
          FROM unnest(h_sid, h_last) AS h(sid, last)
         WHERE s.sid = h.sid AND s.last_seq <> h.last;
        SELECT string_agg(DISTINCT a.sid::text, ',') INTO payload
          FROM unnest(p_sid, firsts) AS a(sid, first) WHERE a.first > 0;
        IF length(payload) > 7000 THEN  -- NOTIFY payloads stop at 8000 bytes: wake every follower instead
            payload := '*';
        END IF;
        PERFORM pg_notify(p_channel, payload);
        RETURN firsts;
    END
    $fn$""",
    "INSERT INTO {schema}.journal_meta (key, value) VALUES ('schema_version', '1') ON CONFLICT (key) DO NOTHING",
)
# Step 2: a fork's row names its parent and the parent's last seq it shares; its ``last_seq`` starts there, so
# ``journal_append`` numbers its own records from ``parent_seq + 1`` unchanged.
_FORKS = (
    "ALTER TABLE {schema}.journal_sessions ADD COLUMN parent_sid bigint, "
    "ADD COLUMN parent_seq bigint NOT NULL DEFAULT 0",
    "UPDATE {schema}.journal_meta SET value = '2' WHERE key = 'schema_version'",
)
# Step 3: each session's newest state snapshot (a cache beside the records; `loopd.harness.core.snapshot`).
_SNAPSHOTS = (
    """CREATE TABLE {schema}.journal_snapshots (
        sid bigint PRIMARY KEY,
        seq bigint NOT NULL,
        state_schema text NOT NULL,
        at double precision NOT NULL,
        data bytea NOT NULL
    )""",
    "UPDATE {schema}.journal_meta SET value = '3' WHERE key = 'schema_version'",
)
_LAST = 2**62  # "no upper bound" for a seq range


@dataclass(frozen=True, slots=True)
class _Statements:
    """Every statement, rendered once with the journal's (quoted) schema name.

    Plain strings rather than ``sql.Composed``: psycopg caches the parsing of a string query, while a composed
    one is rendered again on every execution (measurable at thousands of appends per second).
    """

    create_schema: str
    objects: tuple[str, ...]
    forks: tuple[str, ...]
    snapshots: tuple[str, ...]
    save_snapshot: str
    load_snapshot: str
    last_seq: str
    migrations_table: str
    meta_table: str
    version_get: str
    create: str
    fork: str
    parent_of: str
    take: str
    append: str
    sid_of: str
    read: str
    session: str
    sessions: str

    @classmethod
    def build(cls, schema: str) -> _Statements:
        name = sql.Identifier(schema)

        def q(text: str) -> str:
            return sql.SQL(text).format(schema=name).as_string()

        return cls(
            create_schema=q(_CREATE_SCHEMA),
            objects=tuple(q(s) for s in _OBJECTS),
            forks=tuple(q(s) for s in _FORKS),
            snapshots=tuple(q(s) for s in _SNAPSHOTS),
            # Only for a stored seq; replaces the kept snapshot unless that one is of the same schema and newer.
            save_snapshot=q(
                "INSERT INTO {schema}.journal_snapshots (sid, seq, state_schema, at, data) "
                "SELECT s.sid, %(seq)s, %(schema)s, %(at)s, %(data)s FROM {schema}.journal_sessions s "
                "WHERE s.sid = %(sid)s AND %(seq)s BETWEEN 1 AND s.last_seq "
                "ON CONFLICT (sid) DO UPDATE SET seq = excluded.seq, state_schema = excluded.state_schema, "
                "at = excluded.at, data = excluded.data WHERE journal_snapshots.state_schema <> excluded.state_schema "
                "OR journal_snapshots.seq <= excluded.seq RETURNING 1"
            ),
            load_snapshot=q(
                "SELECT seq, at, data FROM {schema}.journal_snapshots "
                "WHERE sid = %s AND state_schema = %s AND seq <= %s"
            ),
            last_seq=q("SELECT last_seq FROM {schema}.journal_sessions WHERE sid = %s"),
            migrations_table=q("{schema}.journal_migrations"),
            meta_table=q("{schema}.journal_meta"),
            version_get=q("SELECT value FROM {schema}.journal_meta WHERE key = 'schema_version'"),
            create=q(
                "INSERT INTO {schema}.journal_sessions (id, created_at, meta) VALUES (%s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING RETURNING sid, epoch"
            ),
            fork=q(
                "INSERT INTO {schema}.journal_sessions (id, created_at, meta, last_seq, parent_sid, parent_seq) "
                "SELECT %(id)s, %(at)s, %(meta)s, %(seq)s, p.sid, %(seq)s FROM {schema}.journal_sessions p "
                "WHERE p.id = %(parent)s AND %(seq)s BETWEEN 1 AND p.last_seq "
                "ON CONFLICT (id) DO NOTHING RETURNING sid, epoch, parent_sid"
            ),
            parent_of=q("SELECT parent_sid, parent_seq FROM {schema}.journal_sessions WHERE sid = %s"),
            take=q(
                "UPDATE {schema}.journal_sessions SET epoch = epoch + 1 WHERE id = %s "
                "RETURNING sid, epoch, last_seq, parent_sid, parent_seq"
            ),
            append=q(
                "SELECT {schema}.journal_append(%s::bigint[], %s::bigint[], %s::integer[], %s::text[], "
                "%s::integer[], %s::double precision[], %s::bytea[], %s)"
            ),
            sid_of=q("SELECT sid FROM {schema}.journal_sessions WHERE id = %s"),
            read=q(
                "SELECT seq, kind, v, at, data FROM {schema}.journal_records "
                "WHERE sid = %s AND seq >= %s AND seq <= %s ORDER BY seq LIMIT %s"
            ),
            session=q(
                "SELECT s.id, s.created_at, s.last_seq, s.meta, p.id, s.parent_seq FROM {schema}.journal_sessions s "
                "LEFT JOIN {schema}.journal_sessions p ON p.sid = s.parent_sid WHERE s.id = %s"
            ),
            sessions=q(
                "SELECT s.id, s.created_at, s.last_seq, s.meta, p.id, s.parent_seq FROM {schema}.journal_sessions s "
                "LEFT JOIN {schema}.journal_sessions p ON p.sid = s.parent_sid "
                "ORDER BY s.created_at DESC, s.sid DESC LIMIT %s"
            ),
        )


@dataclass(slots=True)
class _Append:
    sid: int
    epoch: int
    records: Sequence[NewRecord]
    future: asyncio.Future[list[int]]


@dataclass(slots=True)
class _Batch:
    items: list[_Append] = field(default_factory=list)
    size: int = 0


@dataclass(slots=True)
class _Columns:
    """One batch as the parallel arrays ``journal_append`` takes."""

    sid: list[int] = field(default_factory=list)
    epoch: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    v: list[int] = field(default_factory=list)
    at: list[float] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, items: Sequence[_Append]) -> _Columns:
        columns = cls()
        for item in items:
            columns.sid.append(item.sid)
            columns.epoch.append(item.epoch)
            columns.count.append(len(item.records))
            for record in item.records:
                columns.kind.append(record.kind)
                columns.v.append(record.version)
                columns.at.append(record.at)
                columns.data.append(record.data)
        return columns


_ERRORS = DatabaseErrors.all_as(JournalError)


class PostgresJournal:
    """A `Journal` in a PostgreSQL schema, shared safely by many processes (server replicas).

    Open with ``await PostgresJournal.open(dsn)``; close with `aclose`. ``commits`` and ``records_written``
    count this instance's append transactions and the records they stored (group commit makes the first much
    smaller than the second under concurrency). ``clock`` measures the followers' poll interval (a test's
    ``VirtualClock`` drives it).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "loopd_journal",
        timeout: float = 10.0,
        max_connections: int = 10,
        max_pending: int = 65_536,
        keepalive: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must match {_SCHEMA_NAME.pattern!r}, got {schema!r}")
        if timeout <= 0 or keepalive <= 0:
            raise ValueError("timeout and keepalive must be positive")
        if max_connections < 2:
            raise ValueError("max_connections must be at least 2 (one writer, one reader)")
        if max_pending < 1:
            raise ValueError("max_pending must be positive")
        self.dsn = dsn
        self.schema = schema
        self._timeout = timeout
        self._max_pending = max_pending
        self._keepalive = keepalive
        self._clock: Clock = clock or SystemClock()
        self._q = _Statements.build(schema)
        self._channel = f"loopd_journal.{schema}"
        # The server gives up a little before the client (statement and lock timeouts at 0.8 × timeout).
        millis = max(1, int(timeout * 800))
        self._options = PostgresOptions(
            timeout=timeout,
            max_connections=max_connections,
            server_timeout=millis / 1000,
            settings=(("idle_in_transaction_session_timeout", str(2 * millis)),),
            application_name="loopd-journal",
            pool_name=f"loopd-journal-{schema}",
            errors=_ERRORS,
        )
        self._db: PostgresDatabase | None = None
        self._layout = Schema(
            "journal",
            (
                Migration(1, "sessions, records, journal_append", self._q.objects),
                Migration(2, "forks: parent_sid and parent_seq of a session", self._q.forks),
                Migration(3, "state snapshots: each session's newest", self._q.snapshots),
            ),
            table=self._q.migrations_table,
            adopt=self._adopt,
        )
        self._pending = _Batch()
        self._flusher: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._sids: dict[str, int] = {}
        self._parents: dict[int, tuple[int, int] | None] = {}  # sid → (parent sid, parent seq) of a fork, or None
        self._followers: dict[int, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._closed = False
        self.commits = 0
        self.records_written = 0

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str = "loopd_journal",
        timeout: float = 10.0,
        max_connections: int = 10,
        max_pending: int = 65_536,
        keepalive: float = 30.0,
        clock: Clock | None = None,
    ) -> PostgresJournal:
        """Connect, create the schema if needed (safe to race with other replicas) and check its version."""
        journal = cls(
            dsn,
            schema=schema,
            timeout=timeout,
            max_connections=max_connections,
            max_pending=max_pending,
            keepalive=keepalive,
            clock=clock,
        )
        try:
            await journal._start()
        except BaseException:
            if journal._db is not None:
                await journal._db.aclose()
            raise
        return journal

    async def _start(self) -> None:
        self._db = await PostgresDatabase.open(self.dsn, self._options)
        async with self._db.transaction(read_only=False) as conn:
            # Replicas starting together would race on CREATE SCHEMA IF NOT EXISTS; one lock per schema name.
            await conn.fetch("SELECT pg_advisory_xact_lock(hashtext(?))", (self._channel,))
            await conn.execute(self._q.create_schema)
        await migrate(self._db, self._layout)

    async def _adopt(self, conn: Connection) -> int:
        """A schema made before the migrator: its version is the ``journal_meta`` row (none: a new schema)."""
        ((table,),) = await conn.fetch("SELECT to_regclass(?)::text", (self._q.meta_table,))
        if table is None:
            return 0
        rows = await conn.fetch(self._q.version_get)
        if not rows:
            return 0
        value = rows[0][0]
        if not str(value).isdigit():
            raise JournalError(
                f"journal schema {self.schema!r} has version {value!r}; this loopd uses version {SCHEMA_VERSION}"
            )
        return int(value)

    # --- plumbing ------------------------------------------------------------------------------------------

    @property
    def _database(self) -> PostgresDatabase:
        if self._db is None or self._db.closed:
            raise JournalError("journal is closed")
        return self._db

    def _io(self, what: str) -> contextlib.AbstractAsyncContextManager[None]:
        """A deadline for one database call, and psycopg failures translated into `JournalError` (the floor's)."""
        return self._database.mapped(what)

    def _connection(self) -> contextlib.AbstractAsyncContextManager[_Connection]:
        """A pooled connection for one call (inside `_io`, which bounds it)."""
        return self._database.pooled()

    def _check_open(self) -> None:
        if self._closed:
            raise JournalError("journal is closed")

    def _remember(self, session_id: str, sid: int) -> None:
        if session_id not in self._sids and len(self._sids) >= _SID_CACHE:
            del self._sids[next(iter(self._sids))]
        self._sids[session_id] = sid

    def _remember_parent(self, sid: int, parent: tuple[int, int] | None) -> None:
        """Cache whether session ``sid`` is a fork, and of which (parent sid, parent seq)."""
        if sid not in self._parents and len(self._parents) >= _SID_CACHE:
            del self._parents[next(iter(self._parents))]
        self._parents[sid] = parent

    async def _sid(self, session_id: str) -> int:
        sid = self._sids.get(session_id)
        if sid is not None:
            return sid
        async with self._io("looking up a session"), self._connection() as conn:
            cur = await conn.execute(self._q.sid_of, (session_id,))
            row = await cur.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        self._remember(session_id, int(row[0]))
        return int(row[0])

    # --- sessions ------------------------------------------------------------------------------------------

    async def create_session(self, session_id: str, *, meta: str = "", at: float) -> JournalWriter:
        self._check_open()
        async with self._io("creating a session"), self._connection() as conn:
            cur = await conn.execute(self._q.create, (session_id, at, meta))
            row = await cur.fetchone()
        if row is None:
            raise SessionBusyError(session_id)
        sid, epoch = int(row[0]), int(row[1])
        self._remember(session_id, sid)
        self._remember_parent(sid, None)
        return _PostgresWriter(self._append, session_id, sid, epoch, 0)

    async def fork_session(
        self, parent_id: str, at_seq: int, session_id: str, *, meta: str = "", at: float
    ) -> JournalWriter:
        self._check_open()
        params = {"id": session_id, "at": at, "meta": meta, "seq": at_seq, "parent": parent_id}
        async with self._io("forking a session"), self._connection() as conn:
            cur = await conn.execute(self._q.fork, params)
            row = await cur.fetchone()
        if row is None:  # why not: an unknown parent, a seq out of its range, or the id is taken
            parent = await self.session(parent_id)
            if parent is None:
                raise SessionNotFoundError(parent_id)
            if not 1 <= at_seq <= parent.last_seq:
                raise ForkPointError(f"session {parent_id!r} has seqs 1..{parent.last_seq}; cannot fork at {at_seq}")
            raise SessionBusyError(session_id)
        sid, epoch, parent_sid = int(row[0]), int(row[1]), int(row[2])
        self._remember(session_id, sid)
        self._remember_parent(sid, (parent_sid, at_seq))
        return _PostgresWriter(self._append, session_id, sid, epoch, at_seq)

    async def open_writer(self, session_id: str) -> JournalWriter:
        self._check_open()
        # Waits for the row lock, so an append in flight on another replica lands before we read last_seq.
        async with self._io("taking over a session"), self._connection() as conn:
            cur = await conn.execute(self._q.take, (session_id,))
            row = await cur.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        sid, epoch, last_seq = int(row[0]), int(row[1]), int(row[2])
        self._remember(session_id, sid)
        self._remember_parent(sid, None if row[3] is None else (int(row[3]), int(row[4])))
        return _PostgresWriter(self._append, session_id, sid, epoch, last_seq)

    # --- group commit --------------------------------------------------------------------------------------

    async def _append(self, sid: int, epoch: int, records: Sequence[NewRecord]) -> list[int]:
        self._check_open()
        if not records:
            return []
        try:
            async with asyncio.timeout(2 * self._timeout):
                while self._pending.size >= self._max_pending:  # back-pressure: wait for the next transaction
                    self._room.clear()
                    await self._room.wait()
                future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
                self._pending.items.append(_Append(sid, epoch, records, future))
                self._pending.size += len(records)
                if self._flusher is None or self._flusher.done():
                    self._flusher = asyncio.create_task(self._flush(), name="loopd-journal-pg-flush")
                # Shielded: a caller giving up must not abort a transaction that other sessions share.
                return await asyncio.shield(future)
        except TimeoutError as exc:
            raise JournalError(f"append timed out after {2 * self._timeout}s; its outcome is unknown") from exc

    async def _flush(self) -> None:
        while self._pending.items:
            batch, self._pending = self._pending, _Batch()
            self._room.set()
            try:
                results = await self._write_batch(batch.items)
            except asyncio.CancelledError:
                self._fail(batch, JournalError("journal closed during append"))
                raise
            except JournalError as exc:  # the transaction failed: every append in it failed (fail-closed)
                self._fail(batch, exc)
                continue
            except Exception as exc:  # e.g. a record psycopg cannot send: still fail-closed, never hang the callers
                error = JournalError(f"append failed: {exc!r}")
                error.__cause__ = exc
                self._fail(batch, error)
                continue
            extended: set[int] = set()
            for item, result in zip(batch.items, results, strict=True):
                if isinstance(result, JournalError):
                    if not item.future.done():
                        item.future.set_exception(result)
                    continue
                extended.add(item.sid)
                if not item.future.done():
                    item.future.set_result(result)
            for sid in extended:
                self._wake(sid)

    @staticmethod
    def _fail(batch: _Batch, error: JournalError) -> None:
        for item in batch.items:
            if not item.future.done():
                item.future.set_exception(error)

    async def _write_batch(self, items: list[_Append]) -> list[list[int] | JournalError]:
        """One statement (so one transaction) for the whole batch; fenced appends get `JournalFencedError`."""
        c = _Columns.of(items)
        params = (c.sid, c.epoch, c.count, c.kind, c.v, c.at, c.data, self._channel)
        async with self._io("appending to the journal"), self._connection() as conn:
            cur = await conn.execute(self._q.append, params)
            row = await cur.fetchone()
        firsts = row[0] if row is not None else None
        if not isinstance(firsts, list) or len(firsts) != len(items):
            raise JournalError(f"append returned {firsts!r} for {len(items)} appends")
        results: list[list[int] | JournalError] = []
        for item, first in zip(items, firsts, strict=True):
            if first == 0:
                results.append(JournalFencedError(f"session writer (epoch {item.epoch}) was fenced"))
                continue
            results.append(list(range(int(first), int(first) + len(item.records))))
            self.records_written += len(item.records)
        self.commits += 1
        return results

    # --- reading -------------------------------------------------------------------------------------------

    async def read(self, session_id: str, from_seq: int = 1, limit: int | None = None) -> list[Record]:
        self._check_open()
        if limit is not None and limit < 0:
            raise ValueError("limit must not be negative")
        start = max(from_seq, 1)
        sid = await self._sid(session_id)
        records: list[Record] = []
        async with self._io("reading the journal"), self._connection() as conn:
            for part, first, last in await self._segments(conn, sid):
                left = None if limit is None else limit - len(records)
                if left == 0:
                    break
                if last < start:
                    continue
                low = max(first, start)
                cur = await conn.execute(self._q.read, (part, low, last, left))
                rows = await cur.fetchall()
                for expected, (seq, kind, v, at, data) in enumerate(rows, low):
                    if seq != expected:
                        raise JournalCorruptError(f"session {session_id!r}: expected seq {expected}, found {seq}")
                    records.append(Record(session_id, int(seq), str(kind), int(v), bytes(data), float(at)))
        return records

    async def _segments(self, conn: _Connection, sid: int) -> list[tuple[int, int, int]]:
        """Where a session's records are: ``(sid, first seq, last seq)`` ranges in seq order — a fork's ancestors'
        shared prefixes, then its own records (one range for any other session)."""
        segments: list[tuple[int, int, int]] = []
        upto = _LAST
        current: int | None = sid
        while current is not None:
            if current not in self._parents:
                cur = await conn.execute(self._q.parent_of, (current,))
                found = await cur.fetchone()
                self._remember_parent(
                    current, None if found is None or found[0] is None else (int(found[0]), int(found[1]))
                )
            parent = self._parents[current]
            first = 1 if parent is None else parent[1] + 1
            if first <= upto:
                segments.append((current, first, upto))
            if parent is None:
                break
            current, upto = parent[0], min(upto, parent[1])
        segments.reverse()
        return segments

    async def follow(self, session_id: str, from_seq: int = 1, *, poll_interval: float = 0.5) -> AsyncIterator[Record]:
        self._check_open()
        sid = await self._sid(session_id)
        self._ensure_listener()
        signal = asyncio.Event()
        self._followers.setdefault(sid, set()).add(signal)
        next_seq = max(from_seq, 1)
        try:
            while True:
                signal.clear()
                page = await self.read(session_id, next_seq, _FOLLOW_PAGE)
                for record in page:
                    yield record
                    next_seq = record.seq + 1
                if len(page) < _FOLLOW_PAGE:
                    await wait_event(self._clock, signal, poll_interval)
        finally:
            waiting = self._followers.get(sid)
            if waiting is not None:
                waiting.discard(signal)
                if not waiting:
                    del self._followers[sid]

    def _wake(self, sid: int) -> None:
        for signal in self._followers.get(sid, ()):
            signal.set()

    def _wake_all(self) -> None:
        for signals in self._followers.values():
            for signal in signals:
                signal.set()

    def _on_notify(self, payload: str) -> None:
        if payload == _NOTIFY_ALL:
            self._wake_all()
            return
        for part in payload.split(","):
            with contextlib.suppress(ValueError):
                self._wake(int(part))

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(), name="loopd-journal-pg-listener")

    async def _listen(self) -> None:
        """Keep one LISTEN connection up (the floor's); followers poll meanwhile."""
        await self._database.listen(
            self._channel,
            self._on_notify,
            on_listening=self._wake_all,  # appends may have committed while nobody listened
            backoff=_LISTEN_RETRY,
            log=_log,
            what="journal listener",
            keepalive=self._keepalive,
        )

    async def session(self, session_id: str) -> SessionInfo | None:
        self._check_open()
        async with self._io("reading a session"), self._connection() as conn:
            cur = await conn.execute(self._q.session, (session_id,))
            row = await cur.fetchone()
        if row is None:
            return None
        return SessionInfo(str(row[0]), float(row[1]), int(row[2]), str(row[3]), row[4], int(row[5]))

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]:
        self._check_open()
        if limit < 0:
            raise ValueError("limit must not be negative")
        async with self._io("listing sessions"), self._connection() as conn:
            cur = await conn.execute(self._q.sessions, (limit,))
            rows = await cur.fetchall()
        return [SessionInfo(str(r[0]), float(r[1]), int(r[2]), str(r[3]), r[4], int(r[5])) for r in rows]

    async def save_snapshot(self, session_id: str, seq: int, schema: str, data: bytes, *, at: float) -> None:
        self._check_open()
        sid = await self._sid(session_id)
        params = {"sid": sid, "seq": seq, "schema": schema, "at": at, "data": data}
        async with self._io("saving a state snapshot"), self._connection() as conn:
            cur = await conn.execute(self._q.save_snapshot, params)
            saved = await cur.fetchone()
            if saved is not None:
                return
            # Nothing written: a seq the session does not hold, or a newer snapshot of this schema is kept.
            cur = await conn.execute(self._q.last_seq, (sid,))
            row = await cur.fetchone()
        last = 0 if row is None else int(row[0])
        if not 1 <= seq <= last:
            raise SnapshotSeqError(f"session {session_id!r} has seqs 1..{last}; no snapshot at {seq}")

    async def load_snapshot(self, session_id: str, schema: str, *, upto: int | None = None) -> Snapshot | None:
        self._check_open()
        sid = await self._sid(session_id)
        limit = _LAST if upto is None else upto
        best: Snapshot | None = None
        async with self._io("loading a state snapshot"), self._connection() as conn:
            # The session's own snapshot, and each ancestor's at or before the fork point that bounds its share.
            for part, _first, last in await self._segments(conn, sid):
                cur = await conn.execute(self._q.load_snapshot, (part, schema, min(last, limit)))
                row = await cur.fetchone()
                if row is not None and (best is None or int(row[0]) > best.seq):
                    best = Snapshot(int(row[0]), schema, bytes(row[2]), float(row[1]))
        return best

    async def aclose(self) -> None:
        """Let the transaction in flight finish (bounded by ``timeout``), stop the listener, close the pool."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None and not self._flusher.done():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout):
                    await asyncio.shield(self._flusher)
            if not self._flusher.done():
                await cancel_and_wait(self._flusher)
        if self._listener is not None:
            await cancel_and_wait(self._listener)
            self._listener = None
        self._wake_all()  # followers find the journal closed on their next read
        if self._db is not None:
            await self._db.aclose()


class _PostgresWriter(SyncedOnReturn):
    """A session's writer: appends through the journal's ``append`` (handed over by the journal) at its epoch."""

    def __init__(
        self,
        append: Callable[[int, int, Sequence[NewRecord]], Awaitable[list[int]]],
        session_id: str,
        sid: int,
        epoch: int,
        last_seq: int,
    ) -> None:
        self._append = append
        self._session_id = session_id
        self._sid = sid
        self._epoch = epoch
        self._last_seq = last_seq
        self._closed = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def last_seq(self) -> int:
        return self._last_seq

    async def append(self, records: Sequence[NewRecord], *, sync: bool = True) -> list[int]:
        if self._closed:
            raise JournalError("writer is closed")
        seqs = await self._append(self._sid, self._epoch, records)
        if seqs:
            self._last_seq = seqs[-1]
        return seqs

    async def aclose(self) -> None:
        self._closed = True
