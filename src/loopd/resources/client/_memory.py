"""The in-memory twin of a Kubernetes API: the real store engine over an in-memory database, with test controls.

Owns: ``InMemoryClient`` — a ``StoreClient`` over its own ``MemoryResourceStore`` (``loopd.resources``: the same
``SemanticStore`` the SQLite and PostgreSQL stores run, on the floor's inline in-memory SQLite), and the controls
that make rare server behaviour happen on demand (``send_bookmarks``, ``compact``, ``end_watches``).
Must not do: Kubernetes semantics of its own (merge and JSON patches, selectors, resourceVersions, finalizers,
cascades and watch bookkeeping are the engine's), threads, or sleeping.

Every write reaches the open watches before it returns and no call waits on a thread, so a test on a virtual
clock sees the twin's effects as soon as the event loop settles. Timestamps and bookmark intervals come from the
``clock`` it is given; only a watch's ``timeout_seconds`` uses the event loop's clock. Kinds the store does not know
(no CRD) are served as their ``ResourceType`` describes them, without a schema. The same contract tests run on this
client, the in-process store client and the HTTP client (tests/reconcile/test_client_contract.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.database import DatabaseErrors
from loopd._infra.sqlite_memory import run_inline
from loopd.resources import KindRef, KindSpec, MemoryResourceStore, NotFound, StoreOptions

from ._errors import TransportError
from ._store import StoreClient
from ._types import ResourceType

_PRESERVE: Mapping[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


class InMemoryClient(StoreClient):
    """A ``ResourceClient`` over the store engine in memory (see module docstring); it owns its store.

    ``history_limit`` is the store's event window: watching from a version older than the retained history raises
    ``Gone``. ``watch_queue_size`` bounds each watch's buffer: a consumer that falls that far behind gets ``Gone``.
    Construction needs no event loop (the in-memory store opens inline). Once closed, calls raise
    ``TransportError`` and open watches end.
    """

    def __init__(
        self,
        *,
        history_limit: int = 1_000,
        watch_queue_size: int = 1_000,
        clock: Clock | None = None,
    ) -> None:
        if history_limit < 1 or watch_queue_size < 1:
            raise ValueError("history_limit and watch_queue_size must be positive")
        options = StoreOptions(
            event_window=history_limit,
            watch_queue_size=watch_queue_size,
            bookmark_interval=86_400.0,  # bookmarks come when a test asks (send_bookmarks)
            clock=clock or SystemClock(),
        )
        self._memory = run_inline(
            MemoryResourceStore.open(options=options, errors=DatabaseErrors.all_as(TransportError))
        )
        super().__init__(self._memory)

    async def aclose(self) -> None:
        """Close the store: calls then raise ``TransportError`` and open watches end."""
        await self._memory.aclose()

    # -- twin controls ---------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._memory.resource_version())

    def send_bookmarks(self) -> None:
        """Send a ``BOOKMARK`` at the current version to every watch that allows bookmarks."""
        self._memory.send_bookmarks()

    def compact(self, resource_version: str | None = None) -> None:
        """Forget history up to ``resource_version`` (default: all); older watches then raise ``Gone``."""
        upto = self._memory.resource_version() if resource_version is None else int(resource_version)
        self._memory.compact(upto)

    def end_watches(self) -> None:
        """End every open watch, as a server restart or a dropped connection would."""
        self._memory.end_watches()

    # -- internals -------------------------------------------------------------------------------------------

    def _kind(self, resource: ResourceType) -> KindRef:
        try:
            self._memory.registry.get(resource.ref)
        except NotFound:
            self._memory.serve(
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
        return resource.ref
