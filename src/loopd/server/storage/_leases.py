"""Leases with fencing tokens: who may drive a resource (e.g. ``harness-call/<id>``) right now.

Table ``leases`` (resource PRIMARY KEY, holder, token, expires_at, acquired_at, updated_at). The row outlives
releases, so tokens only grow: each acquisition gets ``token + 1``. Acquire, renew and release are conditional
updates (one winner under concurrency). A write made under a lease calls ``check_token`` in the same
transaction: a stale token or an expired lease raises ``Fenced``, and on PostgreSQL the lease row is held
``FOR SHARE`` until commit so nobody can take the lease over between the check and the write.
Must not do: renew in the background or schedule work (the Harness Engine does).
"""

from __future__ import annotations

from typing import Any

from ._errors import Fenced, InvalidRecord
from ._records import Lease
from ._tx import TransactionCore
from ._values import parse_time, require_text, seconds, time_text

_COLUMNS = "resource, holder, token, expires_at, acquired_at"


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(
        resource=str(row[0]),
        holder=str(row[1]),
        token=int(row[2]),
        expires_at=parse_time(row[3]),
        acquired_at=parse_time(row[4]),
    )


def _token(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRecord(f"a lease token is a positive integer, not {value!r}")
    return value


class Leases:
    def __init__(self, tx: TransactionCore) -> None:
        self._tx = tx

    async def get(self, resource: str) -> Lease | None:
        row = await self._tx.fetch_one(f"SELECT {_COLUMNS} FROM leases WHERE resource = ?", (resource,))
        return None if row is None else _lease(row)

    async def acquire(self, resource: str, holder: str, ttl_seconds: float) -> Lease | None:
        """Take the lease if it is free or expired (with a new, larger token); ``None`` while someone holds it."""
        require_text(resource, "lease resource")
        require_text(holder, "lease holder")
        ttl = seconds(ttl_seconds, "lease ttl")
        now = self._tx.now()
        now_text, expires = time_text(now), time_text(now + ttl)
        inserted = await self._tx.execute(
            f"INSERT INTO leases ({_COLUMNS}, updated_at) VALUES (?, ?, 1, ?, ?, ?) ON CONFLICT DO NOTHING",
            (resource, holder, expires, now_text, now_text),
        )
        if inserted == 1:
            token = 1  # the row is new: what it holds is what was just written (no read back)
        else:
            row = await self._tx.fetch_one(
                "UPDATE leases SET holder = ?, token = token + 1, expires_at = ?, acquired_at = ?, updated_at = ? "
                "WHERE resource = ? AND (holder = '' OR expires_at <= ?) RETURNING token",
                (holder, expires, now_text, now_text, resource, now_text),
            )
            if row is None:
                return None
            token = int(row[0])
        return Lease(resource, holder, token, parse_time(expires), parse_time(now_text))

    async def expire_others(self, holder: str) -> int:
        """End every live lease not held by ``holder``; how many. Only for a process that knows it is the sole
        user of the database (the embedded server holds the data-directory lock), so earlier holders are dead."""
        require_text(holder, "lease holder")
        now = time_text(self._tx.now())
        return await self._tx.execute(
            "UPDATE leases SET expires_at = ?, updated_at = ? WHERE holder <> ? AND holder <> '' AND expires_at > ?",
            (now, now, holder, now),
        )

    async def renew(self, resource: str, token: int, ttl_seconds: float) -> Lease:
        """Extend a live lease held with ``token``; ``Fenced`` if it expired or was taken over."""
        _token(token)
        ttl = seconds(ttl_seconds, "lease ttl")
        now = self._tx.now()
        changed = await self._tx.execute(
            "UPDATE leases SET expires_at = ?, updated_at = ? "
            "WHERE resource = ? AND token = ? AND holder <> '' AND expires_at > ?",
            (time_text(now + ttl), time_text(now), resource, token, time_text(now)),
        )
        if changed != 1:
            raise Fenced(f"the lease on {resource} with token {token} is no longer held")
        lease = await self.get(resource)
        if lease is None:  # pragma: no cover - the update above just matched the row
            raise Fenced(f"the lease on {resource} vanished")
        return lease

    async def release(self, resource: str, token: int) -> bool:
        """Give the lease up; ``False`` (and nothing changes) when ``token`` no longer holds it."""
        _token(token)
        now = time_text(self._tx.now())
        changed = await self._tx.execute(
            "UPDATE leases SET holder = '', expires_at = ?, updated_at = ? WHERE resource = ? AND token = ? "
            "AND holder <> ''",
            (now, now, resource, token),
        )
        return changed == 1

    async def check_token(self, resource: str, token: int) -> Lease:
        """Inside a write transaction: prove that ``token`` still holds a live lease, or raise ``Fenced``."""
        _token(token)
        row = await self._tx.fetch_one(
            f"SELECT {_COLUMNS} FROM leases WHERE resource = ?{self._tx.for_share}", (resource,)
        )
        if row is None:
            raise Fenced(f"there is no lease on {resource}")
        lease = _lease(row)
        if lease.token != token or not lease.holder:
            raise Fenced(f"token {token} on {resource} is stale (current token {lease.token})")
        if lease.expires_at <= self._tx.now():
            raise Fenced(f"the lease on {resource} with token {token} expired")
        return lease
