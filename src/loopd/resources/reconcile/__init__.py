"""The reconcile runtime: controller-runtime's shape, in Python.

Owns: informers (list + watch + cache), coalescing work queues with per-key exponential backoff, controllers
with bounded concurrency, leader election on Leases, graceful shutdown, counters, and the ``Clock`` seam.
Must not do: talk HTTP or SQL itself (it goes through a ``loopd.resources.client.ResourceClient``), or import
anything of loopd outside ``loopd.resources``.

A controller in twenty lines::

    from loopd.resources import NotFound
    from loopd.resources.client import TASKS, open_http_client
    from loopd.resources.reconcile import LeaderElection, Manager, Request, Result

    class Greeter:
        def __init__(self, client):
            self.client = client

        async def reconcile(self, request: Request) -> Result:
            try:
                task = await self.client.get(TASKS, request.name, namespace=request.namespace)
            except NotFound:
                return Result()                         # gone: nothing to do
            if (task.get("status") or {}).get("phase") == "Succeeded":
                return Result()
            task["status"] = {"phase": "Succeeded", "observedRevision": task["spec"]["revision"]}
            await self.client.update_status(TASKS, task)  # Conflict → retried with backoff
            return Result()

    async def main() -> None:
        async with open_http_client() as client:        # kubeconfig: embedded API or a real cluster
            manager = Manager(client, leader_election=LeaderElection("greeter", namespace="loopd"))
            manager.add_controller(TASKS, Greeter(client), workers=4)
            await manager.run()                         # until cancelled or manager.shutdown()
"""

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock, SystemClock, VirtualClock

from ._controller import (
    Controller,
    ControllerStatistics,
    EventFilter,
    ReconcileFunction,
    Reconciler,
    Request,
    Result,
    Watch,
    ignore_status_updates,
    owner_requests,
)
from ._errors import PermanentError, ReconcileError, TemporaryError
from ._informer import Informer, InformerEvent, InformerStatistics
from ._leader import LeaderElection, LeaderElector, LeaderStatistics
from ._manager import Manager, ManagerStatistics
from ._queue import QueueShutDown, QueueStatistics, WorkQueue

__all__ = [
    "Backoff",
    "Clock",
    "Controller",
    "ControllerStatistics",
    "EventFilter",
    "Informer",
    "InformerEvent",
    "InformerStatistics",
    "LeaderElection",
    "LeaderElector",
    "LeaderStatistics",
    "Manager",
    "ManagerStatistics",
    "PermanentError",
    "QueueShutDown",
    "QueueStatistics",
    "ReconcileError",
    "ReconcileFunction",
    "Reconciler",
    "Request",
    "Result",
    "SystemClock",
    "TemporaryError",
    "VirtualClock",
    "Watch",
    "WorkQueue",
    "ignore_status_updates",
    "owner_requests",
]
