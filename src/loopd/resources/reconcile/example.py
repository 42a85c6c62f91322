"""A sample reconciler: moves a Task's status through ``Pending → Running → Succeeded``.

Owns: nothing of the runtime; it shows the shape of a reconciler and is used by the tests and the latency
benchmark. Must not do: keep state between reconciles.

Each reconcile re-reads the Task, takes exactly one step and writes the status with the version it read
(optimistic concurrency: a concurrent change raises ``Conflict``, the runtime backs off and retries). The
status write is itself an event that wakes the next step. A new ``spec.revision`` restarts the phases.
"""

from __future__ import annotations

from collections.abc import Callable

from loopd.resources import NotFound
from loopd.resources.client import TASKS, ResourceClient

from ._controller import Request, Result

PHASES = ("Pending", "Running", "Succeeded")


class TaskPhaseReconciler:
    """``Pending → Running → Succeeded``, one step per reconcile; restarts on a new ``spec.revision``."""

    def __init__(self, client: ResourceClient, *, on_reconcile: Callable[[Request], None] | None = None) -> None:
        self._client = client
        self._on_reconcile = on_reconcile

    async def reconcile(self, request: Request) -> Result:
        if self._on_reconcile is not None:
            self._on_reconcile(request)
        try:
            task = await self._client.get(TASKS, request.name, namespace=request.namespace)
        except NotFound:
            return Result()  # deleted meanwhile: nothing to do
        if task["metadata"].get("deletionTimestamp"):
            return Result()
        revision = int((task.get("spec") or {}).get("revision") or 1)
        status = dict(task.get("status") or {})
        phase = status.get("phase")
        if status.get("observedRevision") != revision or phase not in PHASES:
            next_phase = PHASES[0]
        elif phase == PHASES[-1]:
            return Result()
        else:
            next_phase = PHASES[PHASES.index(phase) + 1]
        status.update(
            phase=next_phase,
            observedRevision=revision,
            observedGeneration=task["metadata"].get("generation"),
        )
        task["status"] = status
        await self._client.update_status(TASKS, task)
        return Result()
