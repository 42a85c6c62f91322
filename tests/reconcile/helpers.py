"""Test helpers for the reconcile runtime: objects, a fault-injecting client wrapper, small waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Literal

from loopd.resources import ObjectList, WatchEvent
from loopd.resources.client import (
    TASKS,
    JsonObject,
    PatchType,
    ResourceClient,
    ResourceType,
    TransportError,
)


def task(
    name: str, *, namespace: str = "default", revision: int = 1, labels: dict[str, str] | None = None
) -> JsonObject:
    """A minimal valid Task object."""
    metadata: JsonObject = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": TASKS.api_version,
        "kind": TASKS.kind,
        "metadata": metadata,
        "spec": {"target": {"kind": "operator", "key": "router"}, "revision": revision},
    }


class FaultyClient:
    """Wraps a client; while ``failing`` is true every call raises ``TransportError`` (a network partition)."""

    def __init__(self, inner: ResourceClient) -> None:
        self.inner = inner
        self.failing = False
        self.failing_watches = False  # only open_watch fails (lists and writes still work)
        self.fail_resources: set[ResourceType] | None = None  # None: every resource

    def _check(self, resource: ResourceType) -> None:
        if self.failing and (self.fail_resources is None or resource in self.fail_resources):
            raise TransportError("injected partition")

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        self._check(resource)
        return await self.inner.get(resource, name, namespace=namespace)

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        self._check(resource)
        return await self.inner.list(resource, namespace=namespace, label_selector=label_selector)

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        self._check(resource)
        return await self.inner.create(resource, obj, namespace=namespace)

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        self._check(resource)
        return await self.inner.update(resource, obj)

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        self._check(resource)
        return await self.inner.update_status(resource, obj)

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
        self._check(resource)
        return await self.inner.patch(
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
        self._check(resource)
        await self.inner.delete(resource, name, namespace=namespace, resource_version=resource_version)

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
        self._check(resource)
        if self.failing_watches:
            raise TransportError("injected watch failure")
        return self._opened(
            self.inner.open_watch(
                resource,
                namespace=namespace,
                resource_version=resource_version,
                label_selector=label_selector,
                allow_bookmarks=allow_bookmarks,
                timeout_seconds=timeout_seconds,
            )
        )

    def _opened(
        self, watch: AbstractAsyncContextManager[AsyncIterator[WatchEvent]]
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """The watch handed to the caller (a subclass may wrap it)."""
        return watch

    async def aclose(self) -> None:
        await self.inner.aclose()


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel a task and wait for it; re-raise anything but the cancellation."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def shut_down(clock: Any, manager: Any, runner: asyncio.Task[None]) -> None:
    """Stop a manager gracefully on a virtual clock (draining may need virtual time to pass)."""
    manager.shutdown()
    await clock.run_until(runner.done)
    await runner


class DeliveredClient(FaultyClient):
    """Also records the name of every object its lists and watches delivered (``names``)."""

    def __init__(self, inner: ResourceClient) -> None:
        super().__init__(inner)
        self.names: set[str] = set()

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        listing = await super().list(resource, namespace=namespace, label_selector=label_selector)
        self.names.update(str(item["metadata"]["name"]) for item in listing.items)
        return listing

    @asynccontextmanager
    async def _recorded(
        self, opened: AbstractAsyncContextManager[AsyncIterator[WatchEvent]]
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        async with opened as events:

            async def recording() -> AsyncIterator[WatchEvent]:
                async for event in events:
                    if event.type != "BOOKMARK":
                        self.names.add(str(event.object["metadata"]["name"]))
                    yield event

            yield recording()

    def _opened(
        self, watch: AbstractAsyncContextManager[AsyncIterator[WatchEvent]]
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._recorded(watch)
