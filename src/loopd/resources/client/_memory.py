"""The in-memory twin of a Kubernetes API: the real store engine over an in-memory database, with test controls.

Owns: ``InMemoryClient`` — a ``StoreClient`` over a ``MemoryResourceStore`` (``loopd.resources``: the same
``StoreEngine`` the SQLite and PostgreSQL stores run, on the floor's inline in-memory SQLite) opened on first use,
and the controls that make rare server behaviour happen on demand (``send_bookmarks``, ``compact``,
``end_watches``).
Must not do: Kubernetes semantics of its own (merge and JSON patches, selectors, resourceVersions, finalizers,
cascades and watch bookkeeping are the engine's), threads, or sleeping.

Every write is dispatched to the open watches before it returns, and no call waits on a thread, so a test on a
virtual clock sees the twin's effects as soon as the event loop settles. Timestamps come from the ``now`` callable
it is given; only a watch's ``timeout_seconds`` uses the event loop's clock. Kinds the store does not know (no
CRD) are served as the ``ResourceType`` describes them, without a schema. The same contract tests run on this
client, the in-process store client and the HTTP client (tests/reconcile/test_client_contract.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from loopd.resources import KindSpec, MemoryResourceStore, NotFound, ObjectList, StoreOptions, WatchEvent

from ._errors import TransportError
from ._store import StoreClient
from ._types import JsonObject, PatchType, ResourceType


def _utc_now() -> datetime:
    return datetime.now(UTC)


_PRESERVE: Mapping[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


class InMemoryClient:
    """A ``ResourceClient`` over the store engine in memory (see module docstring).

    ``history_limit`` is the store's event window: watching from a version older than the retained history raises
    ``Gone``. ``watch_queue_size`` bounds each watch's buffer: a consumer that falls that far behind gets ``Gone``.
    The store opens on the first call (construction needs no event loop).
    """

    def __init__(
        self,
        *,
        history_limit: int = 1_000,
        watch_queue_size: int = 1_000,
        now: Callable[[], datetime] = _utc_now,
    ) -> None:
        if history_limit < 1 or watch_queue_size < 1:
            raise ValueError("history_limit and watch_queue_size must be positive")
        self._options = StoreOptions(
            event_window=history_limit,
            watch_queue_size=watch_queue_size,
            bookmark_interval=86_400.0,  # bookmarks come when a test asks (send_bookmarks)
            clock=now,
        )
        self._store: MemoryResourceStore | None = None
        self._client: StoreClient | None = None
        self._closed = False

    # -- reads -----------------------------------------------------------------------------------------------

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        return await (await self._open(resource)).get(resource, name, namespace=namespace)

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        return await (await self._open(resource)).list(resource, namespace=namespace, label_selector=label_selector)

    # -- writes ----------------------------------------------------------------------------------------------

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        return await (await self._open(resource)).create(resource, obj, namespace=namespace)

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        return await (await self._open(resource)).update(resource, obj)

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        return await (await self._open(resource)).update_status(resource, obj)

    async def patch(
        self,
        resource: ResourceType,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: Literal["status"] | None = None,
    ) -> JsonObject:
        client = await self._open(resource)
        return await client.patch(
            resource, name, patch, namespace=namespace, patch_type=patch_type, subresource=subresource
        )

    async def delete(
        self,
        resource: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        client = await self._open(resource)
        await client.delete(resource, name, namespace=namespace, resource_version=resource_version)

    async def aclose(self) -> None:
        """Close the store: calls then raise ``TransportError`` and open watches end."""
        self._closed = True
        store, self._store, self._client = self._store, None, None
        if store is not None:
            await store.aclose()

    # -- watch -----------------------------------------------------------------------------------------------

    def open_watch(
        self,
        resource: ResourceType,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: float | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(resource, namespace, resource_version, label_selector, allow_bookmarks, timeout_seconds)

    @asynccontextmanager
    async def _watch(
        self,
        resource: ResourceType,
        namespace: str | None,
        resource_version: str | None,
        label_selector: str | None,
        allow_bookmarks: bool,
        timeout_seconds: float | None,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        client = await self._open(resource)
        async with client.open_watch(
            resource,
            namespace=namespace,
            resource_version=resource_version,
            label_selector=label_selector,
            allow_bookmarks=allow_bookmarks,
            timeout_seconds=timeout_seconds,
        ) as events:
            yield events

    # -- twin controls ---------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion ("0" before the first call opened the store)."""
        return str(self._store.resource_version()) if self._store is not None else "0"

    def send_bookmarks(self) -> None:
        """Send a ``BOOKMARK`` at the current version to every watch that allows bookmarks."""
        if self._store is not None:
            self._store.send_bookmarks()

    def compact(self, resource_version: str | None = None) -> None:
        """Forget history up to ``resource_version`` (default: all); older watches then raise ``Gone``."""
        if self._store is None:
            return
        upto = self._store.resource_version() if resource_version is None else int(resource_version)
        self._store.compact(upto)

    def end_watches(self) -> None:
        """End every open watch, as a server restart or a dropped connection would."""
        if self._store is not None:
            self._store.end_watches()

    # -- internals -------------------------------------------------------------------------------------------

    async def _open(self, resource: ResourceType) -> StoreClient:
        if self._closed:
            raise TransportError("the in-memory client is closed")
        if self._store is None or self._client is None:
            # Opening never suspends (the database runs inline), so two first calls cannot both open a store.
            self._store = await MemoryResourceStore.open(options=self._options)
            self._client = StoreClient(self._store)
        self._serve(self._store, resource)
        return self._client

    @staticmethod
    def _serve(store: MemoryResourceStore, resource: ResourceType) -> None:
        try:
            store.registry.get(resource.ref)
        except NotFound:
            store.serve(
                KindSpec(
                    group=resource.group,
                    version=resource.version,
                    kind=resource.kind,
                    plural=resource.plural,
                    singular=resource.kind.lower(),
                    namespaced=resource.namespaced,
                    status_subresource=resource.status_subresource,
                    schema=_PRESERVE,
                )
            )
