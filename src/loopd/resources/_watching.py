"""Watch fan-out: one pump reads the event log in resourceVersion order and feeds bounded per-watcher buffers.

Owns: ``WatchHub`` (the pump task, watcher registration with a gap-free catch-up, compaction of the event log,
expiry on overflow) and ``Watch`` (the ``WatchStream`` handed to callers, with bookmarks).
Must not do: write objects, or block: a slow watcher is ended with ``Gone``, never waited for.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loopd._infra.backoff import Backoff
from loopd._infra.clock import wait_event
from loopd._infra.jsoncopy import json_copy
from loopd._infra.tasks import cancel_and_wait

from ._errors import BadRequest, Gone, ResourceError
from ._kinds import KindSpec
from ._selectors import FieldSelector, LabelSelector
from ._sql import Change
from ._store import StoreOptions, WatchEvent, WatchEventType

_log = logging.getLogger(__name__)
_RETRY = Backoff(base=0.2, factor=2.0, max_delay=5.0)

_BATCH = 500

#: Reads up to ``limit`` changes after ``rv``; returns them and the compacted resourceVersion.
ReadChanges = Callable[[int, int], Awaitable[tuple[list[Change], int]]]
#: Reads the current objects of a watch target; returns (objects, list resourceVersion).
ReadSnapshot = Callable[[KindSpec, str | None], Awaitable[tuple[list[dict[str, Any]], int]]]


@dataclass(frozen=True)
class WatchTarget:
    spec: KindSpec
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, body: dict[str, Any] | None) -> bool:
        if body is None:
            return False
        metadata = body.get("metadata") or {}
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(body)

    def visible_type(self, change: Change) -> WatchEventType | None:
        """The event this watcher sees for a change (selector transitions become ADDED / DELETED)."""
        if change.key[:2] != self.spec.storage_key:
            return None
        if self.namespace is not None and change.key[2] != self.namespace:
            return None
        if self.labels.empty and self.fields.empty:
            return change.type  # type: ignore[return-value]
        now = self.matches(change.body)
        if change.type == "MODIFIED":
            before = self.matches(change.prev)
            if now and before:
                return "MODIFIED"
            if now:
                return "ADDED"
            return "DELETED" if before else None
        return change.type if now else None  # type: ignore[return-value]


class _Watcher:
    def __init__(self, target: WatchTarget, cursor: int, backlog: list[WatchEvent], limit: int) -> None:
        self.target = target
        self.cursor = cursor
        self.backlog: deque[WatchEvent] = deque(backlog)
        self.buffer: deque[WatchEvent] = deque()
        self.limit = limit
        self.signal = asyncio.Event()
        self.state: Literal["open", "expired", "closed"] = "open"
        self.expiry = ""
        self.bookmark_due = False
        """Set by ``WatchHub.request_bookmarks``: the watch sends a BOOKMARK once its buffer is empty."""

    def offer(self, change: Change) -> None:
        if self.state != "open" or change.rv <= self.cursor:
            return
        self.cursor = change.rv
        kind = self.target.visible_type(change)
        if kind is None:
            return
        if len(self.buffer) >= self.limit:
            self.expire("watch expired: the watcher fell too far behind; relist")
            return
        self.buffer.append(WatchEvent(kind, present(self.target.spec, change.body)))
        self.signal.set()

    def expire(self, reason: str) -> None:
        if self.state == "open":
            self.state = "expired"
            self.expiry = reason
            self.buffer.clear()
            self.backlog.clear()
        self.signal.set()

    def close(self) -> None:
        if self.state == "open":
            self.state = "closed"
        self.signal.set()


def present(spec: KindSpec, body: dict[str, Any]) -> dict[str, Any]:
    """A caller-owned copy of a stored body at the requested version."""
    out: dict[str, Any] = {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": {}}
    out.update(json_copy(body))
    out["apiVersion"] = spec.api_version
    return out


class WatchHub:
    """The single reader of the event log for one store."""

    def __init__(
        self,
        read_changes: ReadChanges,
        read_snapshot: ReadSnapshot,
        compact: Callable[[int], Awaitable[None]],
        on_change: Callable[[Change], None],
        options: StoreOptions,
    ) -> None:
        self._read_changes = read_changes
        self._read_snapshot = read_snapshot
        self._compact = compact
        self._on_change = on_change
        self._options = options
        self._watchers: set[_Watcher] = set()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._dispatched = 0
        self._compacted = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def wake(self) -> asyncio.Event:
        return self._wake

    @property
    def options(self) -> StoreOptions:
        return self._options

    @property
    def dispatched_rv(self) -> int:
        return self._dispatched

    def start(self, dispatched_rv: int, compacted_rv: int, *, pump: bool = True) -> None:
        """Start from the log's state; ``pump=False`` starts no task (the owner calls ``pump_once`` itself)."""
        self._dispatched = dispatched_rv
        self._compacted = compacted_rv
        if pump:
            self._task = asyncio.create_task(self._run(), name="loopd-resources-watch-pump")

    def notify(self) -> None:
        self._wake.set()

    # -- test controls (the in-memory store) ---------------------------------------------------------------------

    def request_bookmarks(self) -> None:
        """Make a BOOKMARK due now on every open watch that asked for bookmarks."""
        for watcher in self._watchers:
            watcher.bookmark_due = True
            watcher.signal.set()

    def compacted(self, through_rv: int) -> None:
        """The event log was compacted through ``through_rv`` (by the caller, in the database)."""
        self._compacted = max(self._compacted, through_rv)

    def end_watches(self) -> None:
        """End every open watch (iteration stops), as a server restart would."""
        for watcher in list(self._watchers):
            watcher.close()
        self._watchers.clear()

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for watcher in list(self._watchers):
            watcher.close()
        self._watchers.clear()

    async def _run(self) -> None:
        failures = 0
        clock = self._options.clock
        while not self._closed:
            await wait_event(clock, self._wake, self._options.poll_interval)
            self._wake.clear()
            try:
                await self.pump_once()
                failures = 0
            except (ResourceError, OSError) as exc:
                failures += 1
                _log.warning("watch pump: reading the event log failed (%s); retrying", exc)
                await clock.sleep(_RETRY.after_failures(failures))
            except Exception:
                # A bug must not silently stop every watch of this store: log it and keep pumping.
                failures += 1
                _log.exception("watch pump: unexpected error; retrying")
                await clock.sleep(_RETRY.after_failures(failures))

    async def pump_once(self) -> None:
        """Dispatch what is committed, then compact the event log beyond the window (one turn of the pump)."""
        await self.drain()
        await self._maybe_compact()

    async def drain(self) -> None:
        """Dispatch every committed change not yet dispatched, in resourceVersion order."""
        async with self._lock:
            while True:
                changes, compacted = await self._read_changes(self._dispatched, _BATCH)
                self._compacted = compacted
                if compacted > self._dispatched:
                    # Another process compacted events we never dispatched: every watcher must relist.
                    for watcher in list(self._watchers):
                        watcher.expire("watch expired: events were compacted before delivery; relist")
                    self._watchers.clear()
                    self._dispatched = compacted
                    continue
                for change in changes:
                    self._dispatch(change)
                if len(changes) < _BATCH:
                    return

    async def dispatch_committed(self, start_rv: int, changes: Sequence[Change]) -> bool:
        """Hand out the changes a writer of this store just committed, in order, without reading the log — when
        they follow what was dispatched (nothing committed after ``start_rv`` before them is still undispatched).
        False when they do not (another process wrote meanwhile, the pump is behind, or read them already): then
        the pump reads the log as usual. The pump is still woken when the log is due for compaction."""
        if self._closed or not changes:
            return False
        async with self._lock:
            if self._dispatched != start_rv:
                return False
            for change in changes:
                self._dispatch(change)
        window = self._options.event_window
        if self._dispatched - self._compacted > window + max(1, window // 10):
            self.notify()
        return True

    def _dispatch(self, change: Change) -> None:
        self._on_change(change)
        for watcher in list(self._watchers):
            watcher.offer(change)
            if watcher.state != "open":
                self._watchers.discard(watcher)
        self._dispatched = change.rv

    async def _maybe_compact(self) -> None:
        window = self._options.event_window
        slack = max(1, window // 10)
        if self._dispatched - self._compacted > window + slack:
            await self._compact(self._dispatched - window)

    async def register(self, target: WatchTarget, resource_version: str | None) -> _Watcher:
        async with self._lock:
            if resource_version in (None, "", "0"):
                objects, list_rv = await self._read_snapshot(target.spec, target.namespace)
                backlog = [WatchEvent("ADDED", present(target.spec, o)) for o in objects if target.matches(o)]
                watcher = _Watcher(target, list_rv, backlog, self._options.watch_queue_size)
            else:
                start = _parse_rv(resource_version)
                backlog_changes: list[Change] = []
                cursor = start
                while cursor < self._dispatched:
                    changes, compacted = await self._read_changes(cursor, _BATCH)
                    if start < compacted:
                        raise Gone(f"too old resource version: {start} ({compacted})")
                    changes = [c for c in changes if c.rv <= self._dispatched]
                    if not changes:
                        break
                    backlog_changes.extend(changes)
                    cursor = changes[-1].rv
                if start < self._compacted:
                    raise Gone(f"too old resource version: {start} ({self._compacted})")
                watcher = _Watcher(target, start, [], self._options.watch_queue_size)
                for change in backlog_changes:
                    kind = target.visible_type(change)
                    if kind is not None:
                        watcher.backlog.append(WatchEvent(kind, present(target.spec, change.body)))
                watcher.cursor = max(start, cursor)
            self._watchers.add(watcher)
            return watcher

    def unregister(self, watcher: _Watcher) -> None:
        self._watchers.discard(watcher)
        watcher.close()


def _parse_rv(value: str) -> int:
    try:
        rv = int(value)
    except ValueError:
        raise BadRequest(f"invalid resource version: {value!r}") from None
    if rv < 0:
        raise BadRequest(f"invalid resource version: {value!r}")
    return rv


class Watch:
    """The ``WatchStream`` a store hands out."""

    def __init__(self, hub: WatchHub, target: WatchTarget, resource_version: str | None, bookmarks: bool) -> None:
        self._hub = hub
        self._target = target
        self._resource_version = resource_version
        self._bookmarks = bookmarks
        self._watcher: _Watcher | None = None
        self._last_bookmark = 0
        self._interval = hub.options.bookmark_interval

    async def __aenter__(self) -> Watch:
        self._watcher = await self._hub.register(self._target, self._resource_version)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._watcher is not None:
            self._hub.unregister(self._watcher)

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        watcher = self._watcher
        if watcher is None:
            raise RuntimeError("use the watch as an async context manager first")
        while True:
            if watcher.state == "expired":
                raise Gone(watcher.expiry)
            if watcher.backlog:
                return watcher.backlog.popleft()
            if watcher.buffer:
                return watcher.buffer.popleft()
            if watcher.state == "closed":
                raise StopAsyncIteration
            if watcher.bookmark_due:
                watcher.bookmark_due = False
                if self._bookmarks:
                    return self._bookmark(max(watcher.cursor, self._hub.dispatched_rv))
            watcher.signal.clear()
            if not self._bookmarks:
                await watcher.signal.wait()
                continue
            if not await wait_event(self._hub.options.clock, watcher.signal, self._interval):
                rv = max(watcher.cursor, self._hub.dispatched_rv)
                if rv > self._last_bookmark and watcher.state == "open" and not watcher.buffer:
                    return self._bookmark(rv)

    def _bookmark(self, rv: int) -> WatchEvent:
        self._last_bookmark = rv
        spec = self._target.spec
        return WatchEvent(
            "BOOKMARK", {"apiVersion": spec.api_version, "kind": spec.kind, "metadata": {"resourceVersion": str(rv)}}
        )
