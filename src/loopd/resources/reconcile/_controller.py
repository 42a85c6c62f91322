"""A controller: informer events → work queue → N workers calling ``Reconciler.reconcile``.

Owns: the reconcile vocabulary (``Request``, ``Result``, ``Reconciler``, ``Watch``), turning informer events
into requests, the workers, what happens after each reconcile (forget, requeue after a delay, back off, give
up), and the controller's counters.
Must not do: run informers or decide leadership (the manager does both); read time except through its ``Clock``.

A controller works in *terms*: the manager starts one when this process may reconcile (it leads, or runs
without leader election) and stops it on shutdown (draining in-flight reconciles) or when leadership is lost
(cancelling them). Each term starts with a fresh queue holding every cached object, so nothing depends on
events seen before.

A controller may filter its primary events (``event_filter``, controller-runtime's predicates): e.g.
`ignore_status_updates`, for a reconciler whose own status writes must not wake it again. Every term still starts
with every cached object, and a requeue or `enqueue` is never filtered.

Wake-ups that no watched resource carries (an in-process event, e.g. "the call this Task waits for ended") go
through ``Controller.enqueue``. A reconciler that wants its controller for that defines ``bind_controller(self,
controller)``: the controller calls it once, when it is created.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, wait_all
from loopd._infra.tasks import TaskSet
from loopd.resources.client import JsonObject, ResourceType, name_of, namespace_of

from ._errors import PermanentError, TemporaryError
from ._informer import Informer, InformerEvent
from ._queue import QueueShutDown, QueueStatistics, WorkQueue

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Request:
    """Which object to reconcile: a key, never a snapshot (the reconciler reads the current state)."""

    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class Result:
    """What to do after a successful reconcile.

    ``requeue_after``: reconcile this key again after that many seconds (a timer, e.g. a deadline or a poll).
    ``requeue``: reconcile again after the key's backoff (progress is pending but nothing failed).
    Neither: wait for the next event.
    """

    requeue_after: float | None = None
    requeue: bool = False

    def __post_init__(self) -> None:
        if self.requeue_after is not None and self.requeue_after < 0:
            raise ValueError("requeue_after must not be negative")


@runtime_checkable
class Reconciler(Protocol):
    """Brings the world in line with one object. Must be idempotent: it may run any number of times."""

    async def reconcile(self, request: Request) -> Result: ...


ReconcileFunction = Callable[[Request], Awaitable[Result | None]]
ReconcileObserver = Callable[[str, float], None]
"""Told (controller name, seconds) after every reconcile, whatever its outcome (e.g. a latency histogram)."""
"""A plain ``async def reconcile(request) -> Result | None`` works too."""


@dataclass(frozen=True, slots=True)
class Watch:
    """A secondary resource whose changes wake primary objects (e.g. the objects a controller owns)."""

    resource: ResourceType
    to_requests: Callable[[JsonObject], Iterable[Request]]
    namespace: str | None = None
    label_selector: str | None = None


def owner_requests(owner: ResourceType) -> Callable[[JsonObject], list[Request]]:
    """Map an owned object to its controlling owner of kind ``owner`` (``ownerReferences`` with ``controller``)."""

    def to_requests(obj: JsonObject) -> list[Request]:
        refs = (obj.get("metadata") or {}).get("ownerReferences") or []
        return [
            Request(str(ref.get("name")), namespace_of(obj) if owner.namespaced else None)
            for ref in refs
            if isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") == owner.kind
            and ref.get("apiVersion") == owner.api_version
            and ref.get("name")
        ]

    return to_requests


EventFilter = Callable[[InformerEvent], bool]
"""Whether a primary event queues its object (True) or is dropped."""

_METADATA_THAT_MATTERS = ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")


def ignore_status_updates(event: InformerEvent) -> bool:
    """Drop a ``MODIFIED`` event that changed only the status (the same ``metadata.generation``, labels,
    annotations, finalizers, owners and deletion timestamp: kube-apiserver bumps ``generation`` on spec changes
    and when deletion starts, never on status writes); keep every other event. controller-runtime's
    GenerationChangedPredicate, plus the metadata a reconciler may act on."""
    if event.type != "MODIFIED" or event.old is None:
        return True
    new_meta = event.object.get("metadata") or {}
    old_meta = event.old.get("metadata") or {}
    new_generation, old_generation = new_meta.get("generation"), old_meta.get("generation")
    if new_generation is None or new_generation != old_generation:
        return True  # a kind without generations, or the spec changed
    return any(new_meta.get(name) != old_meta.get(name) for name in _METADATA_THAT_MATTERS)


@dataclass(frozen=True, slots=True)
class ControllerStatistics:
    name: str
    active: bool
    """Whether a term is running (this process may reconcile)."""
    reconciles: int
    succeeded: int
    failed: int
    """Reconciles that raised (any exception but cancellation)."""
    temporary_errors: int
    permanent_errors: int
    requeued: int
    """Keys scheduled again by a result or an error."""
    in_flight: int
    cancelled: int
    """Reconciles cancelled by a stop (leadership lost, or the drain timeout passed)."""
    queue: QueueStatistics | None
    filtered: int = 0
    """Primary events the controller's ``event_filter`` dropped."""


class Controller:
    """Reconciles one primary resource; created by ``Manager.add_controller``."""

    def __init__(
        self,
        name: str,
        resource: ResourceType,
        reconciler: Reconciler | ReconcileFunction,
        *,
        primary: Informer,
        secondaries: Sequence[tuple[Watch, Informer]],
        workers: int,
        backoff: Backoff,
        clock: Clock,
        on_reconciled: ReconcileObserver | None = None,
        event_filter: EventFilter | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("a controller needs at least one worker")
        self._name = name
        self._resource = resource
        self._reconcile = _as_function(reconciler)
        self._primary = primary
        self._secondaries = tuple(secondaries)
        self._worker_count = workers
        self._backoff = backoff
        self._clock = clock
        self._queue: WorkQueue[Request] | None = None
        self._workers: TaskSet | None = None  # one term's workers
        self._reconciles = 0
        self._succeeded = 0
        self._failed = 0
        self._temporary = 0
        self._permanent = 0
        self._requeued = 0
        self._in_flight = 0
        self._cancelled = 0
        self._on_reconciled = on_reconciled
        self._event_filter = event_filter
        self._filtered = 0
        primary.add_handler(self._on_primary)
        for watch, informer in self._secondaries:
            informer.add_handler(self._secondary_handler(watch))
        bind = getattr(reconciler, "bind_controller", None)
        if callable(bind):
            bind(self)

    @property
    def name(self) -> str:
        return self._name

    @property
    def resource(self) -> ResourceType:
        return self._resource

    @property
    def cache(self) -> Informer:
        """The primary informer: a read-only cache of the watched objects."""
        return self._primary

    def statistics(self) -> ControllerStatistics:
        return ControllerStatistics(
            name=self._name,
            active=self._queue is not None,
            reconciles=self._reconciles,
            succeeded=self._succeeded,
            failed=self._failed,
            temporary_errors=self._temporary,
            permanent_errors=self._permanent,
            requeued=self._requeued,
            in_flight=self._in_flight,
            cancelled=self._cancelled,
            queue=self._queue.statistics() if self._queue is not None else None,
            filtered=self._filtered,
        )

    # -- terms (driven by the manager) -----------------------------------------------------------------------

    async def start(self) -> None:
        """Begin a term: wait for the caches, queue every cached object, start the workers."""
        if self._queue is not None:
            raise RuntimeError(f"controller {self._name} is already running")
        for informer in (self._primary, *(informer for _, informer in self._secondaries)):
            await informer.wait_synced()
        queue: WorkQueue[Request] = WorkQueue(clock=self._clock, backoff=self._backoff)
        self._queue = queue
        for namespace, name in self._primary.cache_keys():
            queue.add(Request(name, namespace))
        for watch, informer in self._secondaries:
            for obj in informer.list():
                for request in watch.to_requests(obj):
                    queue.add(request)
        workers = self._workers = TaskSet(f"controller {self._name}")
        for index in range(self._worker_count):
            workers.start(self._work(queue), name=f"reconcile:{self._name}:{index}")

    async def stop(self, drain_timeout: float | None) -> None:
        """End the term: no new reconciles; let in-flight ones finish within ``drain_timeout`` (``None``:
        cancel them at once), then cancel what is left."""
        queue, self._queue = self._queue, None
        workers, self._workers = self._workers, None
        if queue is None or workers is None:
            return
        queue.shut_down()
        try:
            if drain_timeout is not None and drain_timeout > 0:
                await wait_all(self._clock, workers, drain_timeout)
        finally:
            await workers.aclose()  # cancels what did not finish within the drain timeout
            await queue.aclose()

    # -- events ----------------------------------------------------------------------------------------------

    def enqueue(self, request: Request) -> bool:
        """Reconcile ``request`` soon: queued now, coalesced like any event (a key being reconciled runs once more
        after it). For wake-ups that come from outside the watched resources. False outside a term (nothing is
        lost: every term starts by queueing every cached object)."""
        queue = self._queue
        if queue is None or queue.is_shut_down:
            return False
        queue.add(request)
        return True

    def _on_primary(self, event: InformerEvent) -> None:
        queue = self._queue
        if queue is not None and self._event_filter is not None and not self._event_filter(event):
            self._filtered += 1
            return
        if queue is not None:
            queue.add(Request(name_of(event.object), namespace_of(event.object) if self._resource.namespaced else None))

    def _secondary_handler(self, watch: Watch) -> Callable[[InformerEvent], None]:
        def on_secondary(event: InformerEvent) -> None:
            queue = self._queue
            if queue is None:
                return
            requests = set(watch.to_requests(event.object))
            if event.old is not None:
                requests.update(watch.to_requests(event.old))
            for request in sorted(requests, key=_request_order):
                queue.add(request)

        return on_secondary

    # -- workers ---------------------------------------------------------------------------------------------

    async def _work(self, queue: WorkQueue[Request]) -> None:
        while True:
            try:
                request = await queue.get()
            except QueueShutDown:
                return
            self._in_flight += 1
            try:
                await self._reconcile_one(queue, request)
            except asyncio.CancelledError:
                self._cancelled += 1
                raise
            finally:
                self._in_flight -= 1
                queue.done(request)

    async def _reconcile_one(self, queue: WorkQueue[Request], request: Request) -> None:
        self._reconciles += 1
        started = self._clock.monotonic()
        try:
            try:
                result = await self._reconcile(request)
            finally:
                if self._on_reconciled is not None:
                    self._on_reconciled(self._name, self._clock.monotonic() - started)
        except TemporaryError as exc:
            self._failed += 1
            self._temporary += 1
            self._requeued += 1
            if exc.delay is not None:
                queue.add_after(request, exc.delay)
                logger.info(
                    "reconcile %s of %s: temporary error, retry in %ss: %s", request, self._name, exc.delay, exc
                )
            else:
                delay = queue.add_rate_limited(request)
                logger.info("reconcile %s of %s: temporary error, retry in %ss: %s", request, self._name, delay, exc)
        except PermanentError as exc:
            self._failed += 1
            self._permanent += 1
            queue.forget(request)
            logger.warning("reconcile %s of %s failed permanently: %s", request, self._name, exc)
        except Exception:
            self._failed += 1
            self._requeued += 1
            delay = queue.add_rate_limited(request)
            logger.warning("reconcile %s of %s failed; retry in %ss", request, self._name, delay, exc_info=True)
        else:
            self._succeeded += 1
            result = result or Result()
            if result.requeue_after is not None:
                queue.forget(request)
                queue.add_after(request, result.requeue_after)
                self._requeued += 1
            elif result.requeue:
                queue.add_rate_limited(request)
                self._requeued += 1
            else:
                queue.forget(request)


def _request_order(request: Request) -> tuple[str, str]:
    return (request.namespace or "", request.name)


def _as_function(reconciler: Reconciler | ReconcileFunction) -> ReconcileFunction:
    method: Any = getattr(reconciler, "reconcile", None)
    if method is not None and inspect.iscoroutinefunction(method):
        bound: ReconcileFunction = method
        return bound
    if callable(reconciler):
        return reconciler
    raise TypeError("a reconciler is an object with `async def reconcile(request)` or such a function")
