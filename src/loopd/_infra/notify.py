"""Wake-ups across processes: ``publish(channel, payload)`` after a commit, ``subscribe(channel, handler)``.

A notice says "something keyed ``payload`` changed on ``channel``: read it again". It is never the truth (the
database is): a subscriber that misses one finds the change at its next bounded poll, so a lost notice only
delays. Payloads are small keys (ids), never data.

Two implementations of one `Notifier` protocol:

* `MemoryNotifier`: one process (SQLite mode, tests). ``publish`` calls the channel's handlers at once. Several
  components (or several engines in one test) that share the instance wake each other.
* `PostgresNotifier`: every process on one PostgreSQL database. ``publish`` calls this process's handlers at once
  and queues the notice for the others; a sender task sends the queue in batches with ``pg_notify`` on one
  pooled connection, and a listener keeps one dedicated ``LISTEN`` connection up (the floor's
  ``PostgresDatabase.listen``: keepalive, reconnect with backoff). Every notifier channel travels on one
  PostgreSQL channel (``wire_channel``) as ``"<origin> <channel> <payload>"``; a process ignores its own
  ``origin`` (its handlers were called already). Every database call is bounded by ``timeout``.

Handlers run on the event loop, inline: they must be quick (set an event, queue a key) and must not raise (an
error is logged). A handler called with ``None`` means "anything on this channel may have changed": the
listener (re)connected, so notices sent meanwhile are lost, or the send queue overflowed (``max_pending``
distinct notices waiting) and was collapsed to one such notice per channel.

Must not do: interpret payloads, store anything, or be relied on for correctness (only for latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, Self

from loopd._infra.backoff import Backoff
from loopd._infra.errors import LoopdError
from loopd._infra.tasks import TaskSet

if TYPE_CHECKING:  # the PostgreSQL driver is an optional extra: imported only when a PostgresNotifier opens
    from loopd._infra.postgres import PostgresDatabase

_log = logging.getLogger(__name__)

Handler = Callable[[str | None], None]
"""Called with a notice's payload, or ``None``: anything on the channel may have changed (see the docstring)."""

MAX_CHANNEL: Final = 64
MAX_PAYLOAD: Final = 1024
"""Notices carry ids; PostgreSQL caps a payload at 8000 bytes, far above this."""
MAX_SUBSCRIPTIONS: Final = 1024
DEFAULT_WIRE_CHANNEL: Final = "loopd_wakeups"
DEFAULT_MAX_PENDING: Final = 4096
BATCH: Final = 256
CLOSE_FLUSH: Final = 3.0
"""Seconds `PostgresNotifier.aclose` waits at most for queued notices to go out."""
_SEND_RETRY: Final = Backoff(base=0.05, max_delay=5.0)
_LISTEN_RETRY: Final = Backoff(base=0.1, max_delay=5.0)


class NotifyError(LoopdError, ValueError):
    """A channel or payload a notifier does not take (empty, too long, whitespace in a channel), or too many
    subscriptions."""


def check_notice(channel: str, payload: str) -> None:
    """Raise `NotifyError` unless ``channel`` (1-64 characters, no whitespace) and ``payload`` (at most 1024
    characters, no NUL) can travel as a notice."""
    if not isinstance(channel, str) or not channel or len(channel) > MAX_CHANNEL or any(c.isspace() for c in channel):
        raise NotifyError(f"a notice channel is 1-{MAX_CHANNEL} characters without whitespace, not {channel!r}")
    if not isinstance(payload, str) or len(payload) > MAX_PAYLOAD or "\x00" in payload:
        raise NotifyError(f"a notice payload is a string of at most {MAX_PAYLOAD} characters without NUL")


class Notifier(Protocol):
    """Wake-ups for every subscriber of a channel, in this process and in the others sharing the backend."""

    def publish(self, channel: str, payload: str) -> None:
        """After a commit: tell every subscriber of ``channel`` (here at once, elsewhere soon). Never blocks;
        raises only `NotifyError` for a bad channel or payload."""
        ...

    def subscribe(self, channel: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler`` with every notice on ``channel`` from now on; returns the function that stops it."""
        ...


@dataclass(frozen=True, slots=True)
class NotifierStatistics:
    published: int
    """Notices published by this process."""
    sent: int
    """Of those, sent to the other processes (after deduplication in the queue)."""
    received: int
    """Notices from other processes delivered here."""
    collapsed: int
    """Times the send queue overflowed and a channel's notices became one "anything changed"."""
    listens: int
    """Times the listener started listening (1 + reconnections)."""
    send_failures: int


class _Subscribers:
    """This process's handlers, by channel."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[Handler]] = {}
        self._count = 0

    def add(self, channel: str, handler: Handler) -> Callable[[], None]:
        check_notice(channel, "")
        if self._count >= MAX_SUBSCRIPTIONS:
            raise NotifyError(f"a notifier takes at most {MAX_SUBSCRIPTIONS} subscriptions")
        self._handlers.setdefault(channel, []).append(handler)
        self._count += 1
        removed = False

        def remove() -> None:
            nonlocal removed
            if removed:
                return
            removed = True
            handlers = self._handlers.get(channel, [])
            with contextlib.suppress(ValueError):
                handlers.remove(handler)
                self._count -= 1
            if not handlers:
                self._handlers.pop(channel, None)

        return remove

    def deliver(self, channel: str, payload: str | None) -> None:
        for handler in tuple(self._handlers.get(channel, ())):
            try:
                handler(payload)
            except Exception:  # one faulty subscriber must not stop the others or the publisher
                _log.exception("a notice handler on channel %s failed", channel)

    def deliver_everywhere(self) -> None:
        """``None`` to every handler: anything may have changed."""
        for channel in tuple(self._handlers):
            self.deliver(channel, None)


class MemoryNotifier:
    """The `Notifier` of one process: ``publish`` calls the subscribers at once (see the module docstring)."""

    def __init__(self) -> None:
        self._subscribers = _Subscribers()
        self._published = 0

    def publish(self, channel: str, payload: str) -> None:
        """Call every handler of ``channel`` with ``payload`` now."""
        check_notice(channel, payload)
        self._published += 1
        self._subscribers.deliver(channel, payload)

    def subscribe(self, channel: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler`` with every notice on ``channel``; returns the function that stops it."""
        return self._subscribers.add(channel, handler)

    def statistics(self) -> NotifierStatistics:
        return NotifierStatistics(self._published, 0, 0, 0, 0, 0)

    async def aclose(self) -> None:
        """Nothing to release (for symmetry with `PostgresNotifier`)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class PostgresNotifier:
    """The `Notifier` of every process on one PostgreSQL database (see the module docstring).

    Open with ``await PostgresNotifier.open(dsn)`` (or ``async with``); ``aclose()`` sends what is queued (bounded
    by ``timeout``), stops the listener and the sender and closes both connections.
    """

    def __init__(
        self,
        database: PostgresDatabase,
        *,
        wire_channel: str = DEFAULT_WIRE_CHANNEL,
        max_pending: int = DEFAULT_MAX_PENDING,
        keepalive: float = 30.0,
    ) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._database = database
        self._wire_channel = wire_channel
        self._max_pending = max_pending
        self._keepalive = keepalive
        self._origin = uuid.uuid4().hex[:12]
        self._subscribers = _Subscribers()
        self._pending: dict[tuple[str, str | None], None] = {}
        self._kick = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is queued or being sent
        self._idle.set()
        self._listening = asyncio.Event()
        self._tasks = TaskSet("postgres notifier")
        self._closed = False
        self._published = self._sent = self._received = self._collapsed = self._listens = self._failures = 0

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        timeout: float = 10.0,
        wire_channel: str = DEFAULT_WIRE_CHANNEL,
        max_pending: int = DEFAULT_MAX_PENDING,
        keepalive: float = 30.0,
    ) -> PostgresNotifier:
        """Connect (one pooled connection to send, one to listen) and start the sender and the listener."""
        from loopd._infra.postgres import PostgresDatabase, PostgresOptions

        if not wire_channel.isidentifier() or len(wire_channel) > 63:
            raise NotifyError(f"the PostgreSQL channel must be a plain identifier, not {wire_channel!r}")
        database = await PostgresDatabase.open(
            dsn,
            PostgresOptions(
                timeout=timeout,
                max_connections=1,
                min_connections=1,
                application_name="loopd-notifier",
                label="PostgreSQL (notifier)",
            ),
        )
        notifier = cls(database, wire_channel=wire_channel, max_pending=max_pending, keepalive=keepalive)
        notifier._tasks.start(notifier._listen(), name="loopd-notifier-listen")
        notifier._tasks.start(notifier._send_forever(), name="loopd-notifier-send")
        return notifier

    @property
    def origin(self) -> str:
        """This process's id on the wire (its own notices coming back are ignored)."""
        return self._origin

    async def listening(self, timeout: float) -> bool:
        """Whether the listener listens (waiting up to ``timeout`` for the first time): from then on, notices
        other processes publish reach this one's subscribers."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._listening.wait()
        return self._listening.is_set()

    def statistics(self) -> NotifierStatistics:
        return NotifierStatistics(
            self._published, self._sent, self._received, self._collapsed, self._listens, self._failures
        )

    # --- the protocol --------------------------------------------------------------------------------------------

    def publish(self, channel: str, payload: str) -> None:
        """Call this process's handlers of ``channel`` now and queue the notice for the other processes."""
        check_notice(channel, payload)
        self._published += 1
        self._subscribers.deliver(channel, payload)
        if self._closed:
            return
        self._queue(channel, payload)
        self._idle.clear()
        self._kick.set()

    def subscribe(self, channel: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler`` with every notice on ``channel`` (from any process); returns the function that stops
        it."""
        return self._subscribers.add(channel, handler)

    # --- sending -------------------------------------------------------------------------------------------------

    def _queue(self, channel: str, payload: str | None) -> None:
        if (channel, None) in self._pending or (channel, payload) in self._pending:
            return  # already queued, or covered by "anything changed" on the channel
        if len(self._pending) >= self._max_pending:
            # Collapse the channel's queued notices into one "anything changed": memory stays bounded.
            for key in [key for key in self._pending if key[0] == channel]:
                del self._pending[key]
            self._collapsed += 1
            if len(self._pending) >= self._max_pending:
                return  # other channels fill the queue: this notice is lost (subscribers' polls find the change)
            payload = None
        self._pending[(channel, payload)] = None

    def _wire(self, channel: str, payload: str | None) -> str:
        return f"{self._origin} {channel}" if payload is None else f"{self._origin} {channel} {payload}"

    async def _send(self, batch: list[tuple[str, str | None]]) -> None:
        database = self._database
        async with database.mapped("sending notices"), database.pooled() as conn:
            await conn.execute(
                "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload",
                (self._wire_channel, [self._wire(channel, payload) for channel, payload in batch]),
            )

    def _take(self) -> list[tuple[str, str | None]]:
        batch: list[tuple[str, str | None]] = []
        for key in self._pending:
            batch.append(key)
            if len(batch) >= BATCH:
                break
        for key in batch:
            del self._pending[key]
        return batch

    async def _send_forever(self) -> None:
        failures = 0
        while True:
            if not self._pending:
                self._idle.set()
            await self._kick.wait()
            self._kick.clear()
            while self._pending:
                batch = self._take()
                try:
                    await self._send(batch)
                except Exception as exc:  # the database is away: keep the notices (bounded) and retry with backoff
                    failures += 1
                    self._failures += 1
                    for channel, payload in batch:
                        self._queue(channel, payload)
                    _log.warning("notifier cannot send %d notice(s) (%s); retrying", len(batch), exc)
                    await asyncio.sleep(_SEND_RETRY.after_failures(failures))
                    continue
                failures = 0
                self._sent += len(batch)

    # --- listening -----------------------------------------------------------------------------------------------

    def _on_wire(self, text: str) -> None:
        origin, _, rest = text.partition(" ")
        if origin == self._origin or not rest:
            return
        channel, space, payload = rest.partition(" ")
        self._received += 1
        self._subscribers.deliver(channel, payload if space else None)

    def _on_listening(self) -> None:
        self._listens += 1
        self._listening.set()
        self._subscribers.deliver_everywhere()  # notices sent while nobody listened are lost: re-read everything

    async def _listen(self) -> None:
        await self._database.listen(
            self._wire_channel,
            self._on_wire,
            on_listening=self._on_listening,
            backoff=_LISTEN_RETRY,
            log=_log,
            what="notifier listener",
            keepalive=self._keepalive,
        )

    # --- lifecycle -----------------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Send what is queued (waiting at most the timeout), stop both tasks, close the connections."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(TimeoutError):  # the last notices (an engine's released leases) still go out
            async with asyncio.timeout(min(self._database.options.timeout, CLOSE_FLUSH)):
                await self._idle.wait()
        await self._tasks.aclose(timeout=self._database.options.timeout + 5)
        if self._pending:
            with contextlib.suppress(Exception):
                await self._send(self._take())
        await self._database.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def open_notifier(database_url: str | None, *, timeout: float = 10.0) -> AsyncIterator[Notifier]:
    """The notifier for a server's database: `PostgresNotifier` on a ``postgresql://`` DSN, else a
    `MemoryNotifier` (one process: SQLite)."""
    if database_url is not None and database_url.startswith(("postgresql://", "postgres://")):
        notifier = await PostgresNotifier.open(database_url, timeout=timeout)
        try:
            yield notifier
        finally:
            await notifier.aclose()
    else:
        async with MemoryNotifier() as memory:
            yield memory
