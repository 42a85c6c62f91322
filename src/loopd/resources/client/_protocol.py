"""The ``ResourceClient`` protocol: the one seam between controllers and an API server.

Owns: the contract every client implementation meets (the in-memory twin, the in-process store client, the
HTTP client over ``kubernetes_asyncio``), which a shared contract test suite checks.
Must not do: implement anything.

Contract, in Kubernetes terms:

- Objects are JSON-shaped dicts; every returned dict is the caller's to mutate.
- ``namespace`` is required for namespaced resources (``create`` may take it from ``metadata.namespace``);
  ``list``/``open_watch`` with ``namespace=None`` span all namespaces.
- ``update``/``update_status``/``patch`` honour ``metadata.resourceVersion`` when present (stale → ``Conflict``).
  ``update_status`` changes only ``status``; ``update`` leaves ``status`` alone when the resource has a status
  subresource.
- ``delete`` of an object with finalizers only marks it (``deletionTimestamp``).
- ``open_watch`` streams every change after ``resource_version`` in order (``None``: synthetic ``ADDED`` for
  the current objects first). A too-old version raises ``Gone`` (on enter or while iterating): relist. With
  ``allow_bookmarks`` the stream may carry ``BOOKMARK`` events whose ``metadata.resourceVersion`` is a safe
  point to resume from. A stream may end at any time (timeout, server restart, slow consumer); resume from
  the last seen version.
- Every call is bounded in time; a call that gets no answer raises ``TransportError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from loopd.resources import ObjectList, WatchEvent

from ._types import JsonObject, PatchType, ResourceType


class ResourceClient(Protocol):
    """A small async Kubernetes API client."""

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        """Read one object; ``NotFound`` when it does not exist."""
        ...

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        """Read every matching object (all pages) and the version to start a watch from."""
        ...

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        """Create; ``AlreadyExists`` when the name is taken."""
        ...

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        """Replace the object named by ``obj.metadata`` (not its status when a status subresource exists)."""
        ...

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        """Replace only the status of the object named by ``obj.metadata``."""
        ...

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
        """JSON merge patch (RFC 7386) or JSON patch (RFC 6902) of the object or its status."""
        ...

    async def delete(
        self,
        resource: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Delete (or mark for deletion while finalizers remain); ``resource_version`` is a precondition."""
        ...

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
        """Open a change stream: ``async with client.open_watch(...) as events: async for event in events``."""
        ...

    async def aclose(self) -> None:
        """Release connections; open watches end."""
        ...
