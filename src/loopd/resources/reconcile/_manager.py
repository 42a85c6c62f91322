"""The manager: runs informers and controllers for one process, with leader election and graceful shutdown.

Owns: the shared informers (one per resource, namespace and selector), the controllers, the leadership loop,
and the order of shutdown.
Must not do: reconcile, or read time except through its ``Clock``.

Lifecycle of ``await manager.run()``:

1. Informers start at once (a standby keeps a warm cache).
2. Without leader election, controllers start a term immediately. With it, the manager campaigns for the
   Lease; controllers run only while it leads. Losing the lease cancels in-flight reconciles at once (another
   process may be leading soon) and the manager campaigns again as a standby.
3. ``manager.shutdown()``: stop taking work, let in-flight reconciles finish within ``drain_timeout`` (then
   cancel them), release the Lease, stop the informers; ``run()`` then returns. Cancelling ``run()`` is a kill:
   in-flight reconciles are cancelled at once (no drain; a cancellation during a drain cuts it short), the Lease
   is released, and the cancellation is re-raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock
from loopd._infra.tasks import background, companions, race
from loopd.resources.client import ResourceClient, ResourceType

from ._controller import (
    Controller,
    ControllerStatistics,
    EventFilter,
    ReconcileFunction,
    ReconcileObserver,
    Reconciler,
    Watch,
)
from ._informer import Informer, InformerStatistics
from ._leader import LeaderElection, LeaderElector, LeaderStatistics

logger = logging.getLogger(__name__)

_InformerKey = tuple[ResourceType, str | None, str | None]


@dataclass(frozen=True, slots=True)
class ManagerStatistics:
    running: bool
    leading: bool
    """Whether controllers may reconcile now (always while running without leader election)."""
    leader: LeaderStatistics | None
    controllers: tuple[ControllerStatistics, ...]
    informers: tuple[InformerStatistics, ...]


class Manager:
    """Owns informers and controllers of one process; see the module docstring for the lifecycle."""

    def __init__(
        self,
        client: ResourceClient,
        *,
        leader_election: LeaderElection | None = None,
        clock: Clock | None = None,
        drain_timeout: float = 30.0,
        watch_timeout: float = 300.0,
        on_reconciled: ReconcileObserver | None = None,
    ) -> None:
        self._client = client
        self._on_reconciled = on_reconciled
        self._clock = clock or SystemClock()
        self._elector = LeaderElector(client, leader_election, clock=self._clock) if leader_election else None
        self._drain_timeout = drain_timeout
        self._watch_timeout = watch_timeout
        self._informers: dict[_InformerKey, Informer] = {}
        self._controllers: list[Controller] = []
        self._stopping = asyncio.Event()
        self._running = False
        self._started = False
        self._leading = False

    @property
    def client(self) -> ResourceClient:
        return self._client

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def leading(self) -> bool:
        """Whether controllers are reconciling in this process now."""
        return self._leading

    def informer(
        self, resource: ResourceType, *, namespace: str | None = None, label_selector: str | None = None
    ) -> Informer:
        """The shared informer for this resource, namespace and selector (created on first use)."""
        key = (resource, namespace, label_selector)
        informer = self._informers.get(key)
        if informer is None:
            if self._started:
                raise RuntimeError("informers must be created before the manager runs")
            informer = Informer(
                self._client,
                resource,
                namespace=namespace,
                label_selector=label_selector,
                clock=self._clock,
                watch_timeout=self._watch_timeout,
            )
            self._informers[key] = informer
        return informer

    def add_controller(
        self,
        resource: ResourceType,
        reconciler: Reconciler | ReconcileFunction,
        *,
        name: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        workers: int = 1,
        backoff: Backoff | None = None,
        watches: Sequence[Watch] = (),
        event_filter: EventFilter | None = None,
    ) -> Controller:
        """Reconcile every ``resource`` object (in ``namespace``, matching ``label_selector``) with ``workers``
        concurrent reconciles at most; ``watches`` wake primary objects when secondary ones change;
        ``event_filter`` drops primary events that need no reconcile (e.g. `ignore_status_updates`)."""
        if self._started:
            raise RuntimeError("controllers must be added before the manager runs")
        controller = Controller(
            name or f"{resource.plural}.{len(self._controllers)}",
            resource,
            reconciler,
            primary=self.informer(resource, namespace=namespace, label_selector=label_selector),
            secondaries=[
                (watch, self.informer(watch.resource, namespace=watch.namespace, label_selector=watch.label_selector))
                for watch in watches
            ],
            workers=workers,
            backoff=backoff or Backoff(),
            clock=self._clock,
            on_reconciled=self._on_reconciled,
            event_filter=event_filter,
        )
        self._controllers.append(controller)
        return controller

    def shutdown(self) -> None:
        """Ask ``run()`` to stop gracefully (drain, release the lease) and return."""
        self._stopping.set()

    def loads(self) -> list[tuple[str, float, float]]:
        """Each controller's (name, keys waiting in its queue — ready or delayed —, reconciles running): what a
        metrics scrape reads."""
        loads: list[tuple[str, float, float]] = []
        for controller in self._controllers:
            stats = controller.statistics()
            queue = stats.queue
            loads.append((stats.name, queue.depth + queue.delayed if queue is not None else 0, stats.in_flight))
        return loads

    def statistics(self) -> ManagerStatistics:
        return ManagerStatistics(
            running=self._running,
            leading=self._leading,
            leader=self._elector.statistics() if self._elector else None,
            controllers=tuple(controller.statistics() for controller in self._controllers),
            informers=tuple(informer.statistics() for informer in self._informers.values()),
        )

    async def run(self) -> None:
        """Run until ``shutdown()`` or cancellation (see the module docstring)."""
        if self._started:
            raise RuntimeError("a manager runs once")
        self._started = True
        self._running = True
        try:
            informers = self._informers.values()  # they run until the manager stops (one TaskGroup)
            async with companions([i.run() for i in informers], names=[f"informer:{i.resource}" for i in informers]):
                if self._elector is None:
                    await self._lead(lost=None)
                else:
                    await self._campaign(self._elector)
        finally:
            self._running = False

    async def _campaign(self, elector: LeaderElector) -> None:
        while not self._stopping.is_set():
            if not await elector.acquire(self._stopping):
                return
            lost = asyncio.Event()
            try:
                async with background(self._renew(elector, lost), name="lease-renewer"):  # for exactly one term
                    await self._lead(lost=lost)
            finally:
                if not lost.is_set():
                    await elector.release()

    @staticmethod
    async def _renew(elector: LeaderElector, lost: asyncio.Event) -> None:
        await elector.keep_leading()
        lost.set()

    async def _lead(self, *, lost: asyncio.Event | None) -> None:
        """One term: start every controller, wait for a stop or a loss, then stop them."""
        started: list[Controller] = []
        try:
            # Starting the controllers races a stop or a loss: whichever ends first cancels the other.
            begun, _ = await race(self._start_all(started), self._stop_requested(lost), names=("starter", "stop"))
            if not begun.cancelled:
                begun.result()  # a controller that could not start says so
                self._leading = True
                await self._stop_requested(lost)
        finally:
            self._leading = False
            # A lost lease, or this manager's own cancellation (a kill, not a shutdown): stop at once, no drain.
            current = asyncio.current_task()
            cancelled = current is not None and current.cancelling() > 0
            abort = cancelled or (lost is not None and lost.is_set())
            drain = None if abort else self._drain_timeout
            async with asyncio.TaskGroup() as stopping:  # every controller drains at the same time
                for controller in started:
                    stopping.create_task(controller.stop(drain), name=f"stop:{controller.name}")

    async def _stop_requested(self, lost: asyncio.Event | None) -> None:
        """Until ``shutdown()`` is asked for or (with ``lost``) the lease is lost."""
        if lost is None:
            await self._stopping.wait()
        else:
            await race(self._stopping.wait(), lost.wait(), names=("stopping", "lost"))

    async def _start_all(self, started: list[Controller]) -> None:
        for controller in self._controllers:
            await controller.start()
            started.append(controller)
