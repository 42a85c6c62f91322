"""The informer: list + watch + cache for one resource (client-go's reflector and indexer, in one piece).

Owns: the local cache of one resource type (optionally one namespace and label selector), the resourceVersion it
has seen up to, and keeping both current: list, then watch from the list's version; resume a watch that ends
from the last version seen (bookmarks included); relist on ``410 Gone``; back off on errors.
Must not do: decide anything about objects, block on handlers, or read time except through its ``Clock``.

Handlers are plain callables run synchronously for every change (``ADDED`` / ``MODIFIED`` / ``DELETED``); they
must be quick and must not raise (a controller's handler only adds a key to its work queue). Events only wake:
a reconcile re-reads what it needs.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock
from loopd._infra.jsoncopy import json_copy
from loopd.resources import Gone, ResourceError, WatchEvent
from loopd.resources.client import JsonObject, ResourceClient, ResourceType, resource_version_of
from loopd.resources.client import name_of as _name_of
from loopd.resources.client import namespace_of as _namespace_of

logger = logging.getLogger(__name__)

CacheKey = tuple[str | None, str]  # (namespace, name)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True, slots=True)
class InformerEvent:
    """One change seen by an informer."""

    type: ChangeType
    object: JsonObject
    """The new state; for ``DELETED`` the last state."""
    old: JsonObject | None = None
    """The cached state before the change (``None`` for ``ADDED``)."""

    @property
    def key(self) -> CacheKey:
        return (_namespace_of(self.object), _name_of(self.object))


Handler = Callable[[InformerEvent], None]


@dataclass(frozen=True, slots=True)
class InformerStatistics:
    resource: str
    namespace: str | None
    synced: bool
    cached: int
    resource_version: str
    lists: int
    """Lists done: the first one and every relist."""
    watches: int
    """Watch streams opened."""
    events: int
    """ADDED/MODIFIED/DELETED events applied from watches."""
    bookmarks: int
    expired: int
    """Watches answered with ``410 Gone``."""
    errors: int
    """Lists or watches that failed otherwise (and were retried after a backoff)."""


class Informer:
    """Keeps a cache of one resource current and tells handlers about every change."""

    def __init__(
        self,
        client: ResourceClient,
        resource: ResourceType,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        clock: Clock | None = None,
        watch_timeout: float = 300.0,
        retry_backoff: Backoff | None = None,
        min_watch_duration: float = 1.0,
    ) -> None:
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._label_selector = label_selector
        self._clock = clock or SystemClock()
        self._watch_timeout = watch_timeout
        self._retry_backoff = retry_backoff or Backoff(base=0.5, max_delay=30.0)
        self._min_watch_duration = min_watch_duration
        self._cache: dict[CacheKey, JsonObject] = {}
        self._resource_version = ""
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()
        self._lists = 0
        self._watches = 0
        self._events = 0
        self._bookmarks = 0
        self._expired = 0
        self._errors = 0

    @property
    def resource(self) -> ResourceType:
        return self._resource

    @property
    def namespace(self) -> str | None:
        return self._namespace

    @property
    def label_selector(self) -> str | None:
        return self._label_selector

    @property
    def resource_version(self) -> str:
        """The last version seen (list, event or bookmark): where a watch resumes."""
        return self._resource_version

    @property
    def has_synced(self) -> bool:
        """Whether the first list has been loaded."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def remove_handler(self, handler: Handler) -> None:
        self._handlers.remove(handler)

    # -- the cache -------------------------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> JsonObject | None:
        """A copy of the cached object, if any."""
        ns = namespace if self._resource.namespaced else None
        obj = self._cache.get((ns, name))
        return json_copy(obj) if obj is not None else None

    def list(self) -> builtins.list[JsonObject]:
        """Copies of every cached object."""
        return [json_copy(obj) for _, obj in sorted(self._cache.items(), key=lambda item: _sort_key(item[0]))]

    def cache_keys(self) -> builtins.list[CacheKey]:
        return sorted(self._cache, key=_sort_key)

    def statistics(self) -> InformerStatistics:
        return InformerStatistics(
            resource=self._resource.qualified_name,
            namespace=self._namespace,
            synced=self.has_synced,
            cached=len(self._cache),
            resource_version=self._resource_version,
            lists=self._lists,
            watches=self._watches,
            events=self._events,
            bookmarks=self._bookmarks,
            expired=self._expired,
            errors=self._errors,
        )

    # -- running ---------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        failures = 0
        expired_in_a_row = 0
        must_list = True
        while True:
            try:
                if must_list:
                    await self._relist()
                    must_list = False
                progressed = await self._watch_once()
            except Gone:
                self._expired += 1
                expired_in_a_row += 1
                logger.info("watch of %s expired at %s; relisting", self._resource, self._resource_version)
                must_list = True
                # The first expiry relists at once; expiring again straight after a relist needs a backoff.
                progressed = expired_in_a_row == 1
            except ResourceError as exc:
                self._errors += 1
                logger.warning("list/watch of %s failed: %s", self._resource, exc)
                progressed = False
            except Exception:
                self._errors += 1
                logger.exception("list/watch of %s failed unexpectedly", self._resource)
                progressed = False
            else:
                if progressed:
                    expired_in_a_row = 0
            failures = 0 if progressed else failures + 1
            if failures:
                await self._clock.sleep(self._retry_backoff.after_failures(failures))

    async def _relist(self) -> None:
        listing = await self._client.list(
            self._resource, namespace=self._namespace, label_selector=self._label_selector
        )
        self._lists += 1
        fresh: dict[CacheKey, JsonObject] = {}
        for obj in listing.items:
            fresh[self._key(obj)] = obj
        previous, self._cache = self._cache, fresh
        self._resource_version = listing.resource_version
        for key, obj in fresh.items():
            old = previous.get(key)
            if old is None:
                self._notify(InformerEvent("ADDED", obj))
            elif resource_version_of(old) != resource_version_of(obj):
                self._notify(InformerEvent("MODIFIED", obj, old))
        for key, old in previous.items():
            if key not in fresh:
                self._notify(InformerEvent("DELETED", old, old))
        self._synced.set()

    async def _watch_once(self) -> bool:
        """Watch from the current version until the stream ends; whether it made progress."""
        started = self._clock.monotonic()
        received = False
        async with self._client.open_watch(
            self._resource,
            namespace=self._namespace,
            resource_version=self._resource_version,
            label_selector=self._label_selector,
            allow_bookmarks=True,
            timeout_seconds=self._watch_timeout,
        ) as events:
            self._watches += 1
            async for event in events:
                received = True
                self._apply(event)
        # A stream that ends at once with nothing in it is a failure worth backing off from.
        return received or self._clock.monotonic() - started >= self._min_watch_duration

    def _apply(self, event: WatchEvent) -> None:
        version = resource_version_of(event.object)
        if event.type == "BOOKMARK":
            self._bookmarks += 1
            if version:
                self._resource_version = version
            return
        self._events += 1
        key = self._key(event.object)
        if event.type == "DELETED":
            old = self._cache.pop(key, None)
            if version:
                self._resource_version = version
            self._notify(InformerEvent("DELETED", event.object, old))
            return
        old = self._cache.get(key)
        self._cache[key] = event.object
        if version:
            self._resource_version = version
        self._notify(InformerEvent("ADDED" if old is None else "MODIFIED", event.object, old))

    def _key(self, obj: JsonObject) -> CacheKey:
        return (_namespace_of(obj) if self._resource.namespaced else None, _name_of(obj))

    def _notify(self, event: InformerEvent) -> None:
        for handler in list(self._handlers):
            try:
                handler(event)
            except Exception:
                logger.exception("informer handler for %s failed", self._resource)


def _sort_key(key: CacheKey) -> tuple[str, str]:
    return (key[0] or "", key[1])
