"""The in-process ``ResourceClient``: direct calls into a ``loopd.resources`` store (the all-in-one mode).

Owns: adapting the store's Python API to the client protocol (resource types to kind references, all-pages
lists, watch timeouts).
Must not do: own the store (closing the client leaves the store open), or add semantics of its own: the
store is authoritative, and the same contract tests run here as over HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal

from loopd.resources import KindRef, ObjectList, ResourceStore, WatchEvent

from ._types import JsonObject, PatchType, ResourceType


class StoreClient:
    """A ``ResourceClient`` calling a ``ResourceStore`` in the same process."""

    def __init__(self, store: ResourceStore, *, page_size: int = 500) -> None:
        self._store = store
        self._page_size = page_size

    @property
    def store(self) -> ResourceStore:
        return self._store

    def _kind(self, resource: ResourceType) -> KindRef:
        """The store's name for ``resource`` (the in-memory twin also serves kinds no CRD defined here)."""
        return resource.ref

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        return await self._store.get(self._kind(resource), name, namespace=namespace)

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        items: list[JsonObject] = []
        resource_version = ""
        token: str | None = None
        while True:
            page = await self._store.list(
                self._kind(resource),
                namespace=namespace if resource.namespaced else None,
                label_selector=label_selector,
                limit=self._page_size,
                continue_token=token,
            )
            items.extend(page.items)
            resource_version = resource_version or page.resource_version
            token = page.continue_token
            if not token:
                return ObjectList(items=items, resource_version=resource_version, continue_token=None)

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        return await self._store.create(self._kind(resource), obj, namespace=namespace)

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        return await self._store.update(self._kind(resource), obj)

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        return await self._store.update_status(self._kind(resource), obj)

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
        return await self._store.patch(
            self._kind(resource), name, patch, namespace=namespace, patch_type=patch_type, subresource=subresource
        )

    async def delete(
        self,
        resource: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        await self._store.delete(self._kind(resource), name, namespace=namespace, resource_version=resource_version)

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

    async def aclose(self) -> None:
        """Nothing to release: the store belongs to whoever opened it."""

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
        async with self._store.watch(
            self._kind(resource),
            namespace=namespace if resource.namespaced else None,
            resource_version=resource_version,
            label_selector=label_selector,
            bookmarks=allow_bookmarks,
        ) as stream:
            if timeout_seconds is None:
                yield aiter(stream)
            else:
                deadline = asyncio.get_running_loop().time() + timeout_seconds
                yield _Until(aiter(stream), deadline)


class _Until:
    """``events`` until the loop clock reaches ``deadline``; then the stream ends, as a server timeout would."""

    def __init__(self, events: AsyncIterator[WatchEvent], deadline: float) -> None:
        self._events = events
        self._deadline = deadline

    def __aiter__(self) -> _Until:
        return self

    async def __anext__(self) -> WatchEvent:
        try:
            async with asyncio.timeout_at(self._deadline):
                return await anext(self._events)
        except TimeoutError:
            raise StopAsyncIteration from None
