"""The SQL both store backends share: the tables, and the row operations the engine needs.

Owns: the ``Backend`` seam (implemented by ``_store_sqlite`` and ``_store_postgres`` on the floor's databases;
``Connection`` is the floor's), the ``resource_*`` tables as one migrated ``SCHEMA`` (steps recorded in
``resource_migrations``; step 1 is idempotent, so stores made before the migrator adopt it as they are), the
floor's database errors as ``StoreUnavailable`` (``ERRORS``), and typed row access (objects, owner index, event
log, counters).
Must not do: Kubernetes semantics (the engine decides), or driver specifics (the backends adapt).

Writers are serialized by the backend (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a row lock on the counter), so
resourceVersions commit in increasing order and a reader of the event log always sees a gap-free prefix.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from loopd._infra.database import Connection as Connection
from loopd._infra.database import DatabaseErrors
from loopd._infra.jsontext import compact_lenient
from loopd._infra.jsontext import loads as json_loads
from loopd._infra.migrations import Migration, Schema

from ._errors import StoreUnavailable

SCHEMA_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS resource_counters (
        key TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS resource_objects (
        api_group TEXT NOT NULL,
        resource TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        uid TEXT NOT NULL,
        resource_version BIGINT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (api_group, resource, namespace, name)
    )""",
    "CREATE INDEX IF NOT EXISTS resource_objects_by_namespace ON resource_objects (namespace)",
    """CREATE TABLE IF NOT EXISTS resource_owners (
        owner_uid TEXT NOT NULL,
        api_group TEXT NOT NULL,
        resource TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        PRIMARY KEY (owner_uid, api_group, resource, namespace, name)
    )""",
    """CREATE TABLE IF NOT EXISTS resource_events (
        rv BIGINT PRIMARY KEY,
        api_group TEXT NOT NULL,
        resource TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        type TEXT NOT NULL,
        body TEXT NOT NULL,
        prev_body TEXT
    )""",
    "INSERT INTO resource_counters (key, value) VALUES ('rv', 0) ON CONFLICT (key) DO NOTHING",
    "INSERT INTO resource_counters (key, value) VALUES ('compacted_rv', 0) ON CONFLICT (key) DO NOTHING",
)


SCHEMA = Schema(
    "resource",
    (Migration(1, "objects, owner index, event log, counters", SCHEMA_STATEMENTS),),
    lock_key=7_305_553_211,
)
"""The store's tables. Step 1 only creates what is missing, so a store made before the migrator adopts it."""

ERRORS = DatabaseErrors.all_as(StoreUnavailable)
"""Every database failure of the store is ``StoreUnavailable`` (the engine decides conflicts itself)."""


class Backend(Protocol):
    """A database the engine runs transactions on."""

    def write(self) -> AbstractAsyncContextManager[Connection]:
        """A serialized write transaction (one writer at a time, across processes); rolls back on error."""
        ...

    def read(self) -> AbstractAsyncContextManager[Connection]:
        """A read-only transaction over one consistent snapshot."""
        ...

    async def announce(self, conn: Connection) -> None:
        """Tell other processes, from inside a write transaction, that the event log grew."""
        ...

    def listen(self, wake: Any) -> None:
        """Start calling ``wake.set()`` when another process announces a change (no-op if unsupported)."""
        ...

    async def aclose(self) -> None: ...


ObjectKey = tuple[str, str, str, str]
"""(api_group, resource plural, namespace or "", name)"""


@dataclass(frozen=True)
class Change:
    """One row of the event log."""

    rv: int
    key: ObjectKey
    type: str
    body: dict[str, Any]
    prev: dict[str, Any] | None


def _dumps(obj: Any) -> str:
    return compact_lenient(obj)


async def read_counter(conn: Connection, key: str) -> int:
    rows = await conn.fetch("SELECT value FROM resource_counters WHERE key = ?", (key,))
    return int(rows[0][0]) if rows else 0


async def take_counter(conn: Connection, key: str) -> int:
    """Advance counter ``key`` by one and return its new value (in a write transaction: one statement)."""
    rows = await conn.fetch("UPDATE resource_counters SET value = value + 1 WHERE key = ? RETURNING value", (key,))
    if not rows:
        raise RuntimeError(f"the resource counter {key!r} is missing: the schema was not set up")
    return int(rows[0][0])


async def write_counter(conn: Connection, key: str, value: int) -> None:
    await conn.execute("UPDATE resource_counters SET value = ? WHERE key = ?", (value, key))


async def get_object(conn: Connection, key: ObjectKey) -> dict[str, Any] | None:
    rows = await conn.fetch(
        "SELECT body FROM resource_objects WHERE api_group = ? AND resource = ? AND namespace = ? AND name = ?",
        key,
    )
    return json_loads(rows[0][0]) if rows else None


async def list_objects(
    conn: Connection, group: str, resource: str, namespace: str | None, after: tuple[str, str] | None = None
) -> list[dict[str, Any]]:
    sql = "SELECT body FROM resource_objects WHERE api_group = ? AND resource = ?"
    params: list[Any] = [group, resource]
    if namespace is not None:
        sql += " AND namespace = ?"
        params.append(namespace)
    if after is not None:
        sql += " AND (namespace > ? OR (namespace = ? AND name > ?))"
        params.extend([after[0], after[0], after[1]])
    sql += " ORDER BY namespace, name"
    return [json_loads(row[0]) for row in await conn.fetch(sql, params)]


async def keys_in_namespace(conn: Connection, namespace: str) -> list[ObjectKey]:
    rows = await conn.fetch(
        "SELECT api_group, resource, namespace, name FROM resource_objects WHERE namespace = ? "
        "ORDER BY api_group, resource, name",
        (namespace,),
    )
    return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]


async def put_object(
    conn: Connection,
    key: ObjectKey,
    body: dict[str, Any],
    rv: int,
    owner_uids: list[str],
    *,
    previous_owners: list[str] | None = None,
) -> None:
    """Store ``body`` under ``key`` with its owner index rows. ``previous_owners``: the owners the stored object had
    (``[]`` when it did not exist), when the caller read it in this transaction — unchanged owners then keep their
    rows instead of being deleted and inserted again."""
    uid = str(body.get("metadata", {}).get("uid", ""))
    await conn.execute(
        "INSERT INTO resource_objects (api_group, resource, namespace, name, uid, resource_version, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (api_group, resource, namespace, name) DO UPDATE SET "
        "uid = excluded.uid, resource_version = excluded.resource_version, body = excluded.body",
        (*key, uid, rv, _dumps(body)),
    )
    owners = list(dict.fromkeys(owner_uids))
    if previous_owners is not None and owners == list(dict.fromkeys(previous_owners)):
        return
    if previous_owners is None or previous_owners:
        await conn.execute(
            "DELETE FROM resource_owners WHERE api_group = ? AND resource = ? AND namespace = ? AND name = ?", key
        )
    for owner_uid in owners:
        await conn.execute(
            "INSERT INTO resource_owners (owner_uid, api_group, resource, namespace, name) VALUES (?, ?, ?, ?, ?)",
            (owner_uid, *key),
        )


async def delete_object(conn: Connection, key: ObjectKey) -> None:
    where = "WHERE api_group = ? AND resource = ? AND namespace = ? AND name = ?"
    await conn.execute(f"DELETE FROM resource_objects {where}", key)
    await conn.execute(f"DELETE FROM resource_owners {where}", key)


async def dependents_of(conn: Connection, owner_uid: str) -> list[ObjectKey]:
    rows = await conn.fetch(
        "SELECT api_group, resource, namespace, name FROM resource_owners WHERE owner_uid = ? "
        "ORDER BY api_group, resource, namespace, name",
        (owner_uid,),
    )
    return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]


async def append_event(conn: Connection, change: Change) -> None:
    await conn.execute(
        "INSERT INTO resource_events (rv, api_group, resource, namespace, name, type, body, prev_body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            change.rv,
            *change.key,
            change.type,
            _dumps(change.body),
            None if change.prev is None else _dumps(change.prev),
        ),
    )


async def events_after(conn: Connection, rv: int, limit: int) -> list[Change]:
    rows = await conn.fetch(
        "SELECT rv, api_group, resource, namespace, name, type, body, prev_body FROM resource_events "
        "WHERE rv > ? ORDER BY rv LIMIT ?",
        (rv, limit),
    )
    return [
        Change(
            rv=int(r[0]),
            key=(str(r[1]), str(r[2]), str(r[3]), str(r[4])),
            type=str(r[5]),
            body=json_loads(r[6]),
            prev=None if r[7] is None else json_loads(r[7]),
        )
        for r in rows
    ]


async def compact_events(conn: Connection, through_rv: int) -> None:
    """Forget events up to and including ``through_rv``; watches from older versions then get ``Gone``."""
    current = await read_counter(conn, "compacted_rv")
    if through_rv <= current:
        return
    await conn.execute("DELETE FROM resource_events WHERE rv <= ?", (through_rv,))
    await write_counter(conn, "compacted_rv", through_rv)
