"""The in-memory twin of a Kubernetes API: a ``ResourceClient`` with the store's semantics and no I/O.

Owns: objects, a global resourceVersion, a bounded event history for watch resumption, and test controls
(``send_bookmarks``, ``compact``, ``end_watches``) that make rare server behaviour happen on demand.
Must not do: I/O, threads, or sleeping; it never blocks the event loop. Timestamps come from the ``now``
callable it is given; only a watch's ``timeout_seconds`` uses the event loop's clock.

It follows the rules written in ``loopd.resources`` (README_API.md) and is checked by the same contract tests as
the in-process store client and the HTTP client, so controllers can be unit-tested against it, with a virtual
clock, in milliseconds.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from loopd.resources import (
    AlreadyExists,
    BadRequest,
    Conflict,
    ErrorDetails,
    Gone,
    Invalid,
    LabelSelector,
    NotFound,
    ObjectList,
    WatchEvent,
    apply_patch,
)

from ._errors import TransportError
from ._types import JsonObject, PatchType, ResourceType, metadata_of

_Key = tuple[str, str, str]  # (qualified resource, namespace or "", name)
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def format_timestamp(moment: datetime) -> str:
    """Kubernetes ``Time``: RFC 3339 in UTC with second precision."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class _Change:
    resource_version: int
    resource: str
    namespace: str
    type: ChangeType
    old: JsonObject | None
    new: JsonObject


class _MemoryWatch:
    """One open watch: a bounded buffer of events the twin pushes and the consumer iterates."""

    def __init__(
        self,
        resource: ResourceType,
        namespace: str | None,
        selector: LabelSelector,
        allow_bookmarks: bool,
        queue_size: int,
        deadline: float | None,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self.selector = selector
        self.allow_bookmarks = allow_bookmarks
        self._queue_size = queue_size
        self._deadline = deadline
        self._events: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False
        self._error: Exception | None = None

    def offer(self, change: _Change) -> None:
        if self._ended or change.resource != self.resource.qualified_name:
            return
        if self.namespace is not None and change.namespace != self.namespace:
            return
        was_in = change.old is not None and self._matches(change.old)
        is_in = self._matches(change.new)
        if change.type == "DELETED":
            if was_in or is_in:
                self._push(WatchEvent("DELETED", copy.deepcopy(change.new)))
        elif was_in and is_in:
            self._push(WatchEvent("MODIFIED", copy.deepcopy(change.new)))
        elif is_in:
            self._push(WatchEvent("ADDED", copy.deepcopy(change.new)))
        elif was_in:
            self._push(WatchEvent("DELETED", copy.deepcopy(change.new)))

    def push(self, event: WatchEvent) -> None:
        if not self._ended:
            self._push(event)

    def end(self, error: Exception | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
            self._wakeup.set()

    def _matches(self, obj: Mapping[str, Any]) -> bool:
        return self.selector.matches(metadata_of(obj).get("labels"))

    def _push(self, event: WatchEvent) -> None:
        if len(self._events) >= self._queue_size:
            # A consumer this slow has missed its chance: like the store, end the watch with Gone.
            self._events.clear()
            self.end(Gone("the watch fell too far behind; relist"))
            return
        self._events.append(event)
        self._wakeup.set()

    def __aiter__(self) -> _MemoryWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._events:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wakeup.clear()
            if self._deadline is None:
                await self._wakeup.wait()
                continue
            try:
                async with asyncio.timeout_at(self._deadline):
                    await self._wakeup.wait()
            except TimeoutError:
                self.end()
        return self._events.popleft()


class InMemoryClient:
    """A ``ResourceClient`` over dicts in memory, with Kubernetes semantics (see module docstring).

    ``history_limit`` bounds the retained change history: watching from a version older than the history
    raises ``Gone``. ``watch_queue_size`` bounds each watch's buffer: a consumer that falls that far behind
    gets ``Gone``.
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
        self._history_limit = history_limit
        self._watch_queue_size = watch_queue_size
        self._now = now
        self._objects: dict[_Key, JsonObject] = {}
        self._resource_version = 0
        self._history: deque[_Change] = deque()
        self._compacted = 0  # watching from a version below this one raises Gone
        self._watches: set[_MemoryWatch] = set()
        self._closed = False

    # -- reads -----------------------------------------------------------------------------------------------

    async def get(self, resource: ResourceType, name: str, *, namespace: str | None = None) -> JsonObject:
        self._check_open()
        key = self._key(resource, name, self._namespace(resource, namespace, None))
        return copy.deepcopy(self._require(resource, key))

    async def list(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> ObjectList:
        self._check_open()
        selector = LabelSelector.parse(label_selector)
        items = [
            copy.deepcopy(obj)
            for (qualified, ns, _), obj in sorted(self._objects.items())
            if qualified == resource.qualified_name
            and (namespace is None or not resource.namespaced or ns == namespace)
            and selector.matches(metadata_of(obj).get("labels"))
        ]
        return ObjectList(items=items, resource_version=str(self._resource_version), continue_token=None)

    # -- writes ----------------------------------------------------------------------------------------------

    async def create(
        self, resource: ResourceType, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> JsonObject:
        self._check_open()
        new = self._checked_body(resource, obj)
        meta = new["metadata"]
        ns = self._namespace(resource, namespace, meta.get("namespace"))
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if not name:
            raise Invalid(
                f"{resource.kind}.{resource.group} is invalid: metadata.name: Required value: name or "
                "generateName is required",
                details=self._details(resource, ""),
            )
        key = self._key(resource, name, ns)
        if key in self._objects:
            raise AlreadyExists(
                f'{resource.qualified_name} "{name}" already exists', details=self._details(resource, name)
            )
        meta.update(
            name=name,
            uid=str(uuid.uuid4()),
            generation=1,
            creationTimestamp=format_timestamp(self._now()),
        )
        if ns:
            meta["namespace"] = ns
        for dropped in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(dropped, None)
        if resource.status_subresource:
            new.pop("status", None)
        return copy.deepcopy(self._commit(resource, key, "ADDED", None, new))

    async def update(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        self._check_open()
        return copy.deepcopy(self._replace(resource, self._checked_body(resource, obj), subresource=None))

    async def update_status(self, resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        self._check_open()
        self._check_status_subresource(resource)
        return copy.deepcopy(self._replace(resource, self._checked_body(resource, obj), subresource="status"))

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
        self._check_open()
        if subresource is not None:
            self._check_status_subresource(resource)
        key = self._key(resource, name, self._namespace(resource, namespace, None))
        current = self._require(resource, key)
        patched = apply_patch(copy.deepcopy(current), patch, patch_type)
        meta = patched.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != name:
            raise BadRequest("a patch must not change metadata.name")
        return copy.deepcopy(self._replace(resource, patched, subresource=subresource))

    async def delete(
        self,
        resource: ResourceType,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self._check_open()
        key = self._key(resource, name, self._namespace(resource, namespace, None))
        current = self._require(resource, key)
        meta = current["metadata"]
        if resource_version is not None and resource_version != meta.get("resourceVersion"):
            raise self._conflict(resource, name)
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = format_timestamp(self._now())
                self._commit(resource, key, "MODIFIED", current, marked)
            return
        self._remove(resource, key)

    async def aclose(self) -> None:
        self._closed = True
        self.end_watches()

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
        self._check_open()
        selector = LabelSelector.parse(label_selector)
        deadline = None
        if timeout_seconds is not None:
            deadline = asyncio.get_running_loop().time() + timeout_seconds
        watch = _MemoryWatch(resource, namespace, selector, allow_bookmarks, self._watch_queue_size, deadline)
        if resource_version in (None, "", "0"):
            for (qualified, ns, _), obj in sorted(self._objects.items()):
                if (
                    qualified == resource.qualified_name
                    and (namespace is None or ns == namespace)
                    and selector.matches(metadata_of(obj).get("labels"))
                ):
                    watch.push(WatchEvent("ADDED", copy.deepcopy(obj)))
        else:
            since = self._parse_version(resource_version)
            if since < self._compacted:
                raise Gone(f"too old resource version: {since} ({self._compacted})")
            for change in self._history:
                if change.resource_version > since:
                    watch.offer(change)
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.discard(watch)
            watch.end()

    # -- twin controls ---------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._resource_version)

    def send_bookmarks(self) -> None:
        """Send a ``BOOKMARK`` at the current version to every watch that allows bookmarks."""
        for watch in list(self._watches):
            if watch.allow_bookmarks:
                bookmark = {
                    "apiVersion": watch.resource.api_version,
                    "kind": watch.resource.kind,
                    "metadata": {"resourceVersion": str(self._resource_version)},
                }
                watch.push(WatchEvent("BOOKMARK", bookmark))

    def compact(self, resource_version: str | None = None) -> None:
        """Forget history up to ``resource_version`` (default: all); older watches then raise ``Gone``."""
        upto = self._resource_version if resource_version is None else self._parse_version(resource_version)
        while self._history and self._history[0].resource_version <= upto:
            self._history.popleft()
        self._compacted = max(self._compacted, upto)

    def end_watches(self) -> None:
        """End every open watch, as a server restart or a dropped connection would."""
        for watch in list(self._watches):
            watch.end()

    # -- internals -------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the in-memory client is closed")

    def _check_status_subresource(self, resource: ResourceType) -> None:
        if not resource.status_subresource:
            raise NotFound(
                f"the server could not find the requested resource ({resource.qualified_name}/status)",
                details=self._details(resource, ""),
            )

    @staticmethod
    def _details(resource: ResourceType, name: str) -> ErrorDetails:
        return ErrorDetails(name=name, group=resource.group, kind=resource.plural)

    def _conflict(self, resource: ResourceType, name: str) -> Conflict:
        return Conflict(
            f'Operation cannot be fulfilled on {resource.qualified_name} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            details=self._details(resource, name),
        )

    @staticmethod
    def _parse_version(resource_version: str | None) -> int:
        try:
            return int(resource_version or "0")
        except ValueError as exc:
            raise BadRequest(f"invalid resourceVersion {resource_version!r}") from exc

    @staticmethod
    def _namespace(resource: ResourceType, namespace: str | None, from_body: Any) -> str:
        if not resource.namespaced:
            return ""
        if namespace and from_body and namespace != from_body:
            raise BadRequest("the namespace of the provided object does not match the namespace sent on the request")
        return str(namespace or from_body or "default")

    @staticmethod
    def _key(resource: ResourceType, name: str, namespace: str) -> _Key:
        return (resource.qualified_name, namespace, name)

    def _require(self, resource: ResourceType, key: _Key) -> JsonObject:
        obj = self._objects.get(key)
        if obj is None:
            raise NotFound(f'{resource.qualified_name} "{key[2]}" not found', details=self._details(resource, key[2]))
        return obj

    @staticmethod
    def _checked_body(resource: ResourceType, obj: Mapping[str, Any]) -> JsonObject:
        body = copy.deepcopy(dict(obj))
        for field, expected in (("apiVersion", resource.api_version), ("kind", resource.kind)):
            given = body.setdefault(field, expected)
            if given != expected:
                raise BadRequest(f"{field} {given!r} does not match the resource ({expected!r})")
        meta = body.get("metadata")
        if meta is None:
            meta = body["metadata"] = {}
        if not isinstance(meta, dict):
            raise BadRequest("metadata must be an object")
        return body

    def _replace(
        self, resource: ResourceType, body: JsonObject, *, subresource: Literal["status"] | None
    ) -> JsonObject:
        meta = body["metadata"]
        name = str(meta.get("name") or "")
        key = self._key(resource, name, self._namespace(resource, None, meta.get("namespace")))
        current = self._require(resource, key)
        given_version = meta.get("resourceVersion")
        if given_version and given_version != current["metadata"].get("resourceVersion"):
            raise self._conflict(resource, name)
        new = copy.deepcopy(current)
        if subresource == "status":
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        else:
            kept_status = current.get("status")
            new = {k: v for k, v in body.items() if k != "metadata"}
            if resource.status_subresource:
                new.pop("status", None)
                if kept_status is not None:
                    new["status"] = copy.deepcopy(kept_status)
            new["metadata"] = self._merged_metadata(current["metadata"], meta)
            if self._spec_of(new) != self._spec_of(current):
                new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if new == current:
            return current
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._commit(resource, key, "MODIFIED", current, new)
            return self._remove(resource, key)
        return self._commit(resource, key, "MODIFIED", current, new)

    @staticmethod
    def _merged_metadata(current: Mapping[str, Any], given: Mapping[str, Any]) -> JsonObject:
        """System fields come from the stored object; user fields from the request."""
        merged = copy.deepcopy(dict(given))
        for system in (
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
        ):
            if system in current:
                merged[system] = copy.deepcopy(current[system])
            else:
                merged.pop(system, None)
        return merged

    @staticmethod
    def _spec_of(obj: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in obj.items() if k not in ("metadata", "status")}

    def _commit(
        self, resource: ResourceType, key: _Key, change_type: ChangeType, old: JsonObject | None, new: JsonObject
    ) -> JsonObject:
        self._resource_version += 1
        new["metadata"]["resourceVersion"] = str(self._resource_version)
        self._objects[key] = new
        self._record(_Change(self._resource_version, key[0], key[1], change_type, old, copy.deepcopy(new)))
        return new

    def _remove(self, resource: ResourceType, key: _Key) -> JsonObject:
        current = self._objects.pop(key)
        self._resource_version += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._resource_version)
        self._record(_Change(self._resource_version, key[0], key[1], "DELETED", current, gone))
        self._collect_dependents(str(current["metadata"].get("uid") or ""))
        return gone

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background cascade: delete whatever names the removed owner in its ``ownerReferences``."""
        if not owner_uid:
            return
        for key, obj in list(self._objects.items()):
            refs = metadata_of(obj).get("ownerReferences") or []
            if key in self._objects and any(ref.get("uid") == owner_uid for ref in refs):
                meta = obj["metadata"]
                resource = _resource_for(obj, key[0], bool(key[1]))
                if meta.get("finalizers"):
                    if not meta.get("deletionTimestamp"):
                        marked = copy.deepcopy(obj)
                        marked["metadata"]["deletionTimestamp"] = format_timestamp(self._now())
                        self._commit(resource, key, "MODIFIED", obj, marked)
                else:
                    self._remove(resource, key)

    def _record(self, change: _Change) -> None:
        self._history.append(change)
        while len(self._history) > self._history_limit:
            dropped = self._history.popleft()
            self._compacted = dropped.resource_version
        for watch in list(self._watches):
            watch.offer(change)


def _resource_for(obj: Mapping[str, Any], qualified: str, namespaced: bool) -> ResourceType:
    plural, _, group = qualified.partition(".")
    api_version = str(obj.get("apiVersion") or "")
    return ResourceType(
        group=group,
        version=api_version.rpartition("/")[2],
        kind=str(obj.get("kind") or ""),
        plural=plural,
        namespaced=namespaced,
    )
