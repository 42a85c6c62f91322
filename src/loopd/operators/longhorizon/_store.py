"""`RunStore`: the typed reads and writes of Runs, Executions and Audits the operator makes, over ``rt.resources``.

Owns: create with an owner (Run → its Task; an Execution or Audit → its Run), get-or-create by name (a re-run finds
what an earlier run made, when its spec is the same), status writes guarded by ``resourceVersion``, releasing a Run
from its Task (so it outlives the Task for the retention TTL), deleting. Errors the operator decides on become this
package's: `RunGone` (the object is not there: its Task or conversation was deleted) and `StaleRun` (it changed since
it was read: read again); every other error is the runtime's (retryable ones are requeued).
Must not do: decide anything (the operator does), retry, or reach loop-server.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from loopd.operators.longhorizon._errors import RunGone, StaleRun
from loopd.operators.longhorizon._resources import (
    GROUP,
    VERSION,
    Audit,
    AuditStatus,
    Execution,
    ExecutionStatus,
    Run,
    RunStatus,
)
from loopd.resources import NotFound as ResourceNotFound
from loopd.resources import ResourceError
from loopd.resources.client import ResourceType
from loopd.runtime import AlreadyExists, Conflict, NotFound, Runtime, Task

__all__ = ["CONVERSATION_LABEL", "RUNS", "RunStore", "label_value"]

RUNS: Final = ResourceType(GROUP, VERSION, "Run", "runs")
CONVERSATION_LABEL: Final = f"{GROUP}/conversation"
"""The label naming a Run's conversation (so the Runs of one conversation are listed without reading all)."""


def label_value(value: str) -> str:
    """``value`` as a label value (≤ 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends; conversation ids are)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63].strip("._-")
    return cleaned or "none"


@asynccontextmanager
async def _decided(what: str) -> AsyncIterator[None]:
    try:
        yield
    except AlreadyExists:
        raise
    except NotFound as exc:
        raise RunGone(f"{what}: {exc.message}") from exc
    except Conflict as exc:
        raise StaleRun(f"{what}: {exc.message}") from exc


class RunStore:
    """Typed access to the operator's resources in the runtime's namespace."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._runs = rt.resources(Run)
        self._executions = rt.resources(Execution)
        self._audits = rt.resources(Audit)

    # -- Runs ------------------------------------------------------------------------------------------------------

    async def find_run(self, name: str) -> Run | None:
        """The Run ``name``, or None."""
        return await self._runs.find(name)

    async def get_run(self, name: str) -> Run:
        """The Run ``name`` (`RunGone` when absent)."""
        async with _decided(f"run {name}"):
            return await self._runs.get(name)

    async def list_runs(self, *, conversation: str | None = None) -> list[Run]:
        """Every Run of the namespace, or only those of ``conversation`` (by their `CONVERSATION_LABEL`)."""
        selector = f"{CONVERSATION_LABEL}={label_value(conversation)}" if conversation else None
        runs = await self._runs.list(label_selector=selector)
        return [r for r in runs if conversation is None or r.spec.conversation.name == conversation]

    async def create_run(self, run: Run, *, owner: Task) -> Run:
        """Create ``run`` owned by the Task ``owner``, or get the Run of that name made by an earlier reconcile."""
        async with _decided(f"run {run.metadata.name}"):
            return await self._runs.create(run, owner=owner, exist_ok=True)

    async def write_run_status(self, run: Run, status: RunStatus) -> Run:
        """Replace the Run's status, guarded by the ``resourceVersion`` ``run`` was read at."""
        async with _decided(f"run {run.metadata.name}"):
            return await self._runs.replace_status(run.model_copy(update={"status": status}))

    async def release_run(self, run: Run) -> None:
        """Drop the Run's owner references: it then outlives its Task until the retention TTL deletes it."""
        if not run.metadata.owner_references:
            return
        client = await self._rt.resource_client()
        patch = {"metadata": {"ownerReferences": None}}
        try:
            await client.patch(RUNS, str(run.metadata.name), patch, namespace=run.metadata.namespace)
        except ResourceNotFound as exc:
            raise RunGone(f"run {run.metadata.name}: {exc}") from exc
        except ResourceError as exc:
            raise StaleRun(f"run {run.metadata.name}: could not release it from its Task: {exc}") from exc

    async def delete_run(self, run: Run) -> None:
        """Delete this incarnation of the Run (its Executions and Audits go with it); gone already is fine."""
        async with _decided(f"run {run.metadata.name}"):
            await self._runs.delete(str(run.metadata.name), uid=run.metadata.uid, missing_ok=True)

    # -- Executions and Audits -------------------------------------------------------------------------------------

    async def ensure_execution(self, execution: Execution, run: Run) -> Execution:
        """Create the round's Execution (owned by ``run``) or get the same one made before."""
        async with _decided(f"execution {execution.metadata.name}"):
            return await self._executions.create(execution, owner=run, exist_ok=True)

    async def get_execution(self, name: str) -> Execution:
        """The Execution ``name`` (`RunGone` when absent)."""
        async with _decided(f"execution {name}"):
            return await self._executions.get(name)

    async def write_execution_status(self, execution: Execution, status: ExecutionStatus) -> Execution:
        """Replace the Execution's status (guarded by its resource version)."""
        async with _decided(f"execution {execution.metadata.name}"):
            return await self._executions.replace_status(execution.model_copy(update={"status": status}))

    async def ensure_audit(self, audit: Audit, run: Run) -> Audit:
        """Create the round's Audit (owned by ``run``) or get the same one made before."""
        async with _decided(f"audit {audit.metadata.name}"):
            return await self._audits.create(audit, owner=run, exist_ok=True)

    async def write_audit_status(self, audit: Audit, status: AuditStatus) -> Audit:
        """Replace the Audit's status (guarded by its resource version)."""
        async with _decided(f"audit {audit.metadata.name}"):
            return await self._audits.replace_status(audit.model_copy(update={"status": status}))
