"""``rt.task``: the Task verbs (read a Task's context and messages, list a responder's Tasks) and ``task.watch``.

Owns: the ``Task`` a reconciler gets, the ``TaskReconciler`` shape, and the adapter that puts it on the reconcile
runtime (``loopd.resources.reconcile``): Tasks are filtered to ``spec.target`` = (kind, key), Tasks being deleted
are skipped, the Task's status says who holds it (written beside the reconcile, not before it — and only once the
reconcile has run for ``CLAIM_DELAY`` or has ended, so the write never competes with its first reads; awaited
before the reconcile returns; a Task this runtime has completed by then is gone and is not claimed),
``TaskNotReady`` becomes a short requeue and the runtime's typed errors a requeue with the key's backoff, logged with
the task id.
Must not do: read Tasks' content from the Kubernetes API (Tasks hold routing only; content comes over HTTP), or
import loopd.server / loopd.harness.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock
from loopd._infra.tasks import race
from loopd._infra.telemetry import task_span
from loopd.resources import ResourceError
from loopd.resources.client import TASKS, ResourceClient
from loopd.resources.reconcile import Informer, LeaderElection, Request, Result, TemporaryError

from ._client import ServerClient
from ._errors import CapacityFull, NotFound, RuntimeApiError, TaskNotReady
from ._records import Message, TaskContext, TaskSummary

if TYPE_CHECKING:
    from ._runtime import Runtime

logger = logging.getLogger("loopd.runtime")


@dataclass(frozen=True, slots=True)
class Task:
    """A Task addressed to this operator, as a reconciler gets it: routing only (the question is read with
    ``rt.task.get(task.id)``). ``uid`` is the owner UID for harness calls: stable for the Task's life."""

    id: str
    """The task id (= the Task's name)."""
    uid: str
    namespace: str
    revision: int
    """``spec.revision``: bumped by the server to wake the responder again (e.g. a follow-up was posted)."""
    target_kind: str
    target_key: str
    phase: str | None = None
    """``status.phase`` as last written (None before a responder took the Task)."""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Task:
        """The ``Task`` of a Task resource (as the Kubernetes API returns it)."""
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        target = spec.get("target") or {}
        status = obj.get("status") or {}
        return cls(
            id=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            namespace=str(metadata.get("namespace") or ""),
            revision=int(spec.get("revision") or 1),
            target_kind=str(target.get("kind") or ""),
            target_key=str(target.get("key") or ""),
            phase=status.get("phase") if isinstance(status, Mapping) else None,
        )


@runtime_checkable
class TaskReconciler(Protocol):
    """Answers Tasks. ``reconcile`` may run any number of times for one Task (a wake, a restart, another replica
    after a take-over): it must be idempotent — start harness calls and questions by effect key, publish outputs by
    key, and complete (which is idempotent). Return ``Result(requeue_after=s)`` to look again later, or ``None``."""

    async def reconcile(self, task: Task) -> Result | None: ...


TaskReconcileFunction = Callable[[Task], Awaitable[Result | None]]
"""A plain ``async def reconcile(task) -> Result | None`` works too."""


@dataclass(frozen=True, slots=True)
class WatchSpec:
    """One ``task.watch`` registration, turned into a controller when the runtime runs."""

    kind: str
    key: str
    reconciler: TaskReconciler | TaskReconcileFunction
    workers: int
    leader_election: str | LeaderElection | None


class TaskVerbs:
    """``rt.task``: Task reads over loop-server's HTTP API, and ``watch``."""

    def __init__(self, runtime: Runtime, client: ServerClient) -> None:
        self._runtime = runtime
        self._client = client

    async def get(self, task_id: str, *, messages: int = 0) -> TaskContext:
        """The Task's question (``input``), the ``response`` being written, the conversation and its history through
        the input; with ``messages`` (1–100) also the first messages of the Task itself (``context.messages``,
        ``more_messages`` when there are others), saving a ``task.messages`` request. ``TaskNotReady`` (a
        ``NotFound``) while the question has not committed yet — inside ``task.watch`` the runtime requeues the Task
        shortly — or once the Task is gone."""
        params = {"messages": messages} if messages else None
        try:
            body = await self._client.request("GET", f"/v1/tasks/{task_id}", params=params, what=f"task {task_id}")
        except NotFound as exc:
            raise TaskNotReady(exc.message, type=exc.type, status=exc.status) from exc
        return TaskContext.from_json(body)

    async def messages(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """One page of every visible message of the Task (its main and work conversation), in id order; pass
        ``after=page[-1].id`` for the next page (a page shorter than ``limit`` is the last)."""
        body = await self._client.request(
            "GET", f"/v1/tasks/{task_id}/messages", params={"after": after, "limit": limit}, what=f"task {task_id}"
        )
        return [Message.from_json(m) for m in body.get("data") or ()]

    async def followups(self, task_id: str, *, after: str | None = None, limit: int = 100) -> list[Message]:
        """One page of user inputs posted to the Task's conversation after its own input (context added while it
        works), in id order; page like ``messages``."""
        body = await self._client.request(
            "GET", f"/v1/tasks/{task_id}/followups", params={"after": after, "limit": limit}, what=f"task {task_id}"
        )
        return [Message.from_json(m) for m in body.get("data") or ()]

    async def list(self, target_key: str, *, kind: str = "operator", page_size: int = 100) -> list[TaskSummary]:
        """Every Task addressed to ``kind:target_key`` whose delivery is not closed (all pages), oldest first.
        Only that responder itself (or the admin) may list: ``Forbidden`` otherwise."""
        found: list[TaskSummary] = []
        after: str | None = None
        while True:
            body = await self._client.request(
                "GET",
                "/v1/tasks",
                params={"target_kind": kind, "target_key": target_key, "after": after, "limit": page_size},
                what=f"tasks of {kind}:{target_key}",
            )
            found.extend(TaskSummary.from_json(t) for t in body.get("data") or ())
            after = body.get("next_after")
            if not after:
                return found

    def watch(
        self,
        target_key: str,
        reconciler: TaskReconciler | TaskReconcileFunction,
        *,
        workers: int = 4,
        leader_election: str | LeaderElection | None = None,
        kind: str = "operator",
    ) -> None:
        """Reconcile every Task addressed to ``kind:target_key`` with ``reconciler`` (at most ``workers`` at once)
        once ``rt.run()`` runs. ``leader_election``: a Lease name (or a ``LeaderElection``) — of several replicas
        only the holder reconciles. Call before ``run()``. This runtime then acts as ``kind:target_key``."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._runtime.add_watch(WatchSpec(kind, target_key, reconciler, workers, leader_election))


CLAIM_DELAY: Final = 0.25
"""Seconds a reconcile runs before its Task's status is written (at its end if sooner, unless the Task was answered
by then): an answer's reads and harness calls do not share the event loop with bookkeeping, and a quick answer's
Task, deleted at its completion, is never written at all."""


class AnsweredTasks:
    """The ids of the Tasks this runtime completed lately (bounded: the newest ``limit``): their status needs no
    claim any more — the server deletes a Task when it completes."""

    def __init__(self, limit: int = 4096) -> None:
        self._order: deque[str] = deque(maxlen=limit)
        self._ids: set[str] = set()

    def add(self, task_id: str) -> None:
        """``task_id`` was completed."""
        if task_id in self._ids:
            return
        if len(self._order) == self._order.maxlen:
            self._ids.discard(self._order[0])
        self._order.append(task_id)
        self._ids.add(task_id)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._ids


class TaskController:
    """The reconcile-runtime face of one ``task.watch`` (see the module docstring)."""

    def __init__(
        self,
        spec: WatchSpec,
        *,
        informer: Informer,
        resources: ResourceClient,
        clock: Clock,
        not_ready_backoff: Backoff | None = None,
        answered: AnsweredTasks | None = None,
    ) -> None:
        self._spec = spec
        self._answered = answered if answered is not None else AnsweredTasks()
        self._informer = informer
        self._resources = resources
        self._clock = clock
        method = getattr(spec.reconciler, "reconcile", None)
        self._reconcile: TaskReconcileFunction = method if callable(method) else spec.reconciler  # type: ignore[assignment]
        self._actor = f"{spec.kind}:{spec.key}"
        self._not_ready = not_ready_backoff or Backoff(base=0.1, factor=2.0, max_delay=5.0, jitter=0.2)
        self._waiting: dict[str, int] = {}  # task id → consecutive TaskNotReady (dropped when it passes or is gone)

    async def reconcile(self, request: Request) -> Result:
        obj = self._informer.get(request.name, request.namespace)
        if obj is None:
            self._waiting.pop(request.name, None)
            return Result()
        task = Task.from_object(obj)
        if (task.target_kind, task.target_key) != (self._spec.kind, self._spec.key):
            return Result()
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            self._waiting.pop(task.id, None)
            return Result()
        failure: Exception | None = None
        result: Result | None = None
        # The status write runs beside the reconcile (not before it): a reconcile's first step is usually a read of
        # the Task's context, and waiting for the write first only delays it — so does running it at once beside
        # those reads on one event loop: it starts after CLAIM_DELAY, or when the reconcile ends if sooner. Both end
        # before this returns.
        ended = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            if self._claim_needed(obj, task):
                group.create_task(self._claim_soon(obj, task, ended), name=f"claim:{task.id}")
            try:
                with task_span(  # while tracing: this pass joins the trace of the question the Task carries
                    "loopd.runtime",
                    f"invoke_agent {self._spec.key}",
                    (obj.get("metadata") or {}).get("annotations"),
                    {
                        "gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": self._spec.key,
                        "loopd.task.id": task.id,
                    },
                ):
                    result = await self._reconcile(task)
            except Exception as exc:  # handled below, once the status write has ended
                failure = exc
            finally:
                ended.set()
        if failure is None:
            self._waiting.pop(task.id, None)
            return result if result is not None else Result()
        if isinstance(failure, TaskNotReady):
            tries = self._waiting[task.id] = self._waiting.get(task.id, 0) + 1
            return Result(requeue_after=self._not_ready.after_failures(tries))
        if isinstance(failure, RuntimeApiError):
            self._waiting.pop(task.id, None)
            logger.warning(
                "task %s (%s): %s %s; retrying with backoff",
                task.id,
                self._actor,
                type(failure).__name__,
                failure.message,
            )
            delay = failure.retry_after if isinstance(failure, CapacityFull) else None
            raise TemporaryError(f"task {task.id}: {failure.message}", delay=delay) from failure
        raise failure

    def _claim_needed(self, obj: Mapping[str, Any], task: Task) -> bool:
        status = obj.get("status") or {}
        return not (status.get("responder") == self._actor and status.get("observedRevision") == task.revision)

    async def _claim_soon(self, obj: Mapping[str, Any], task: Task, ended: asyncio.Event) -> None:
        started = self._clock.now()
        await race(ended.wait(), self._clock.sleep(CLAIM_DELAY), names=(None, None))
        if task.id in self._answered:
            return  # completed (so deleted) before its claim was due: nothing to say about who holds it
        await self._claim(obj, task, started)

    async def _claim(self, obj: Mapping[str, Any], task: Task, started: datetime) -> None:
        """Say in the Task's status who holds it (once per revision; a failed write is logged, never fatal)."""
        status = obj.get("status") or {}
        wanted = {
            "phase": "Running",
            "responder": self._actor,
            "startedAt": status.get("startedAt") or started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "observedRevision": task.revision,
        }
        try:
            await self._resources.patch(
                TASKS, task.id, {"status": wanted}, namespace=task.namespace or None, subresource="status"
            )
        except ResourceError as exc:
            logger.info("task %s: could not write its status: %s", task.id, exc)
