"""The store contract: the ``ResourceStore`` Protocol and the value types it speaks.

Owns: ``ResourceStore``, ``StoreOptions``, ``ObjectList``, ``WatchEvent``, ``WatchStream`` and the small literal
vocabularies (field validation, propagation policy). Must not do: implement anything (see ``_semantics``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from loopd._infra.clock import Clock, SystemClock

from ._kinds import KindRef, KindRegistry
from ._patching import PatchType

FieldValidation = Literal["Ignore", "Warn", "Strict"]
PropagationPolicy = Literal["Background", "Foreground", "Orphan"]
WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


@dataclass(frozen=True)
class StoreOptions:
    """Tuning knobs shared by every store implementation."""

    event_window: int = 10_000
    """How many change events are retained for watches; a watch from an older resourceVersion gets ``Gone``."""
    watch_queue_size: int = 1_000
    """Per-watcher buffer; a watcher that falls this far behind is ended with ``Gone`` (writers never wait)."""
    bookmark_interval: float = 30.0
    """Seconds of silence after which a watch with ``bookmarks=True`` receives a BOOKMARK."""
    poll_interval: float = 1.0
    """Fallback poll of the event log, for changes made by other processes or replicas."""
    operation_timeout: float = 10.0
    """Upper bound for every database call."""
    clock: Clock = field(default_factory=SystemClock)
    """Wall time for creationTimestamp / deletionTimestamp; intervals (polls, retries, bookmarks) on its timers."""


@dataclass(frozen=True)
class ObjectList:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None = None
    remaining_item_count: int | None = None  # with a limit and no selector: how many items later pages hold


@dataclass(frozen=True)
class WatchEvent:
    type: WatchEventType
    object: dict[str, Any]


class WatchStream(Protocol):
    """``async with store.watch(...) as stream: async for event in stream``.

    Entering raises ``Gone`` when the requested resourceVersion is no longer retained; iterating raises ``Gone``
    when this watcher fell too far behind; iteration stops when the store closes.
    """

    async def __aenter__(self) -> WatchStream: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    async def __anext__(self) -> WatchEvent: ...


class ResourceStore(Protocol):
    """A Kubernetes-semantics object store. See ``README_API.md`` for the rules."""

    @property
    def registry(self) -> KindRegistry: ...

    async def create(
        self,
        ref: KindRef,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]: ...

    async def get(self, ref: KindRef, name: str, *, namespace: str | None = None) -> dict[str, Any]: ...

    async def list(
        self,
        ref: KindRef,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> ObjectList: ...

    async def update(
        self,
        ref: KindRef,
        obj: Mapping[str, Any],
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]: ...

    async def update_status(
        self, ref: KindRef, obj: Mapping[str, Any], *, namespace: str | None = None, dry_run: bool = False
    ) -> dict[str, Any]: ...

    async def patch(
        self,
        ref: KindRef,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: Literal["status"] | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Ignore",
    ) -> dict[str, Any]: ...

    async def delete(
        self,
        ref: KindRef,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
        propagation_policy: PropagationPolicy = "Background",
        dry_run: bool = False,
    ) -> dict[str, Any]: ...

    def watch(
        self,
        ref: KindRef,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        bookmarks: bool = False,
    ) -> WatchStream: ...

    async def current_resource_version(self) -> str: ...

    async def aclose(self) -> None: ...
