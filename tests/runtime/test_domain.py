"""Domain resources through the runtime: ``rt.ensure_crds``, ``rt.resources(Model)`` and ``rt.watch(Model, owns=...)``,
each run (a) over the in-memory resource client and (b) over the embedded Kubernetes API over TLS of a real
`loopd up` (admin kubeconfig of the data directory, and an operator token restricted to its own group)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loopd.operators.longhorizon import (
    Execution,
    ExecutionSpec,
    ExecutionStatus,
    ObjectRef,
    Run,
    RunSpec,
    RunStatus,
    crds,
    execution_name,
)
from loopd.resources import ObjectMeta, render_kubeconfig
from loopd.resources.client import TASKS, InMemoryClient
from loopd.runtime import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Result,
    Runtime,
    Task,
    open_runtime,
)
from loopd.runtime._domain import CRDS
from loopd.server._composition import RunningServer
from tests.support.waiting import eventually


def _task_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "loopd.dev/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"target": {"kind": "operator", "key": "longhorizon"}, "revision": 1},
    }


def _run(name: str, goal: str = "Create hello.txt") -> Run:
    return Run(
        metadata=ObjectMeta(name=name),
        spec=RunSpec(conversation=ObjectRef(name="c1"), inputMessageID="m1", goal=goal),
    )


@asynccontextmanager
async def _runtime(api: str, server: RunningServer) -> AsyncIterator[Runtime]:
    memory = InMemoryClient() if api == "memory" else None
    try:
        async with open_runtime(data_dir=server.data_dir, resources=memory) as rt:
            yield rt
    finally:
        if memory is not None:
            await memory.aclose()


async def _task(rt: Runtime, name: str) -> Task:
    client = await rt.resource_client()
    return Task.from_object(await client.create(TASKS, _task_object(name), namespace="default"))


async def test_replicas_applying_the_same_crds_at_once_all_succeed(server: RunningServer) -> None:
    """Two replicas of one operator start together: both read "not found" and create, or both update from one read;
    the loser of each race re-reads instead of failing (a 409 used to end the process)."""
    async with open_runtime(data_dir=server.data_dir) as first, open_runtime(data_dir=server.data_dir) as second:
        async with open_runtime(data_dir=server.data_dir) as third:
            applied = await asyncio.gather(*(rt.ensure_crds(crds()) for rt in (first, second, third)))
        assert {tuple(c["metadata"]["name"] for c in crds_) for crds_ in applied} == {
            ("runs.longhorizon.loopd.dev", "executions.longhorizon.loopd.dev", "audits.longhorizon.loopd.dev")
        }
        changed = crds()
        for manifest in changed:
            manifest["spec"]["versions"][0].setdefault("additionalPrinterColumns", []).append(
                {"name": "Note", "type": "string", "jsonPath": ".metadata.name"}
            )
        await asyncio.gather(first.ensure_crds(changed), second.ensure_crds(changed))  # both update from one read
        client = await first.resource_client()
        for manifest in changed:
            held = await client.get(CRDS, manifest["metadata"]["name"])
            assert held["spec"]["versions"][0]["additionalPrinterColumns"][-1]["name"] == "Note"


@pytest.mark.parametrize("api", ["memory", "embedded"])
async def test_typed_verbs_create_read_write_status_and_collect_garbage(api: str, server: RunningServer) -> None:
    async with _runtime(api, server) as rt:
        established = await rt.ensure_crds(crds())
        assert [c["metadata"]["name"] for c in established] == [
            "runs.longhorizon.loopd.dev",
            "executions.longhorizon.loopd.dev",
            "audits.longhorizon.loopd.dev",
        ]
        again = await rt.ensure_crds(crds())  # nothing changed: nothing written
        assert [c["metadata"]["resourceVersion"] for c in again] == [
            c["metadata"]["resourceVersion"] for c in established
        ]
        task = await _task(rt, "task-1")
        runs, executions = rt.resources(Run), rt.resources(Execution)

        run = await runs.create(_run("task-1"), owner=task)
        assert run.metadata.uid and run.metadata.namespace == "default"
        assert run.spec.max_rounds == 25  # the schema's default, applied by the API
        (ref,) = run.metadata.owner_references or []
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Task", "task-1", task.uid, True)
        assert (await runs.get("task-1")).metadata.uid == run.metadata.uid
        assert await runs.find("nope") is None
        with pytest.raises(NotFound):
            await runs.get("nope")
        assert [r.metadata.name for r in await runs.list()] == ["task-1"]

        with pytest.raises(AlreadyExists):
            await runs.create(_run("task-1"), owner=task)
        assert (await runs.create(_run("task-1"), owner=task, exist_ok=True)).metadata.uid == run.metadata.uid
        with pytest.raises(AlreadyExists):
            await runs.create(_run("task-1", goal="something else"), owner=task, exist_ok=True)

        too_long = _run("too-long")
        too_long.spec.goal = "x" * 16_001  # past the model's own check: the API's schema refuses it too
        with pytest.raises(Invalid) as caught:
            await runs.create(too_long)
        assert any(field == "spec.goal" for _, field, _ in caught.value.causes)
        client = await rt.resource_client()
        with pytest.raises(Exception, match="spec is immutable"):
            await client.patch(runs.type, "task-1", {"spec": {"goal": "changed"}}, namespace="default")

        planned = await runs.patch_status("task-1", RunStatus(phase="Planning", round=1, budget=25))
        assert planned.status is not None and (planned.status.phase, planned.status.round) == ("Planning", 1)
        stale = planned.model_copy(deep=True)
        moved = await runs.patch_status(
            "task-1", {"phase": "Executing"}, resource_version=planned.metadata.resource_version
        )
        assert moved.status is not None and moved.status.budget == 25  # merged, not replaced
        assert stale.status is not None
        stale.status.phase = "Auditing"
        with pytest.raises(Conflict):
            await runs.replace_status(stale)
        with pytest.raises(Conflict):
            await runs.patch_status("task-1", {"phase": "Failed"}, resource_version=planned.metadata.resource_version)
        moved.status = RunStatus(phase="Auditing", round=1)
        replaced = await runs.replace_status(moved)
        assert replaced.status is not None and replaced.status.budget is None  # the whole status

        labeled = await runs.patch("task-1", {"metadata": {"labels": {"conversation": "c1"}}})
        assert labeled.metadata.labels == {"conversation": "c1"} and labeled.status == replaced.status
        with pytest.raises(Invalid, match="spec is immutable"):
            await runs.patch("task-1", [{"op": "replace", "path": "/spec/goal", "value": "other"}], patch_type="json")

        other = await runs.create(_run("other"))
        await runs.patch_status("other", {"phase": "Receiving"})  # changed since `other` was read: still deleted
        with pytest.raises(Conflict):
            await runs.delete("other", uid="not-its-uid")
        await runs.delete("other", uid=other.metadata.uid)
        assert await runs.find("other") is None

        execution = Execution(
            metadata=ObjectMeta(name=execution_name("task-1", 1)),
            spec=ExecutionSpec(run="task-1", round=1, contract_version=1, plan="write hello.txt"),
        )
        made = await executions.create(execution, owner=replaced)
        assert made.metadata.name == "task-1-r1"
        # The Task goes: the Run goes with it, and the Execution with the Run.
        await client.delete(TASKS, "task-1", namespace="default")
        assert await runs.find("task-1") is None
        assert await executions.find("task-1-r1") is None
        await runs.delete("task-1", missing_ok=True)
        with pytest.raises(NotFound):
            await runs.delete("task-1")


class Driver:
    """A tiny Run reconciler: a Run without a phase gets its round-1 Execution and waits in Executing; once that
    Execution completed, the Run succeeds. Records what it saw."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.seen: list[tuple[str, str | None]] = []

    async def reconcile(self, run: Run) -> Result | None:
        name = run.metadata.name or ""
        phase = run.status.phase if run.status else None
        self.seen.append((name, phase))
        if phase is None:
            execution = Execution(
                metadata=ObjectMeta(name=execution_name(name, 1)),
                spec=ExecutionSpec(run=name, round=1, contract_version=1, plan="do it"),
            )
            made = await self.rt.resources(Execution).create(execution, owner=run, exist_ok=True)
            await self.rt.resources(Run).patch_status(
                name, RunStatus(phase="Executing", round=1, execution=ObjectRef(name=made.metadata.name or ""))
            )
        elif phase == "Executing":
            execution = await self.rt.resources(Execution).get(execution_name(name, 1))
            if execution.status is not None and execution.status.phase == "Completed":
                await self.rt.resources(Run).patch_status(name, {"phase": "Succeeded"})
        return None


@pytest.mark.parametrize("api", ["memory", "embedded"])
async def test_watch_reconciles_runs_and_is_woken_by_what_they_own(api: str, server: RunningServer) -> None:
    async with _runtime(api, server) as rt:
        await rt.ensure_crds(crds())
        task = await _task(rt, "task-2")
        await rt.resources(Run).create(_run("task-2"), owner=task)
        driver = Driver(rt)
        rt.watch(Run, driver, owns=(Execution,), workers=2, leader_election="longhorizon-test")
        runner = asyncio.create_task(rt.run())
        try:
            await eventually(lambda: rt.managers and all(m.leading for m in rt.managers), what="the watch to start")

            async def phase() -> str | None:
                run = await rt.resources(Run).get("task-2")
                return run.status.phase if run.status else None

            await eventually(lambda: _is(phase(), "Executing"), what="the Run to execute")
            # Only the owned Execution changes; the owner wakes up and finishes.
            await rt.resources(Execution).patch_status("task-2-r1", ExecutionStatus(phase="Completed"))
            await eventually(lambda: _is(phase(), "Succeeded"), what="the Run to succeed")
            assert ("task-2", "Executing") in driver.seen
        finally:
            rt.shutdown()
            await asyncio.wait_for(runner, 30)
        (manager,) = rt.managers
        (controller,) = manager.statistics().controllers
        assert controller.failed == 0


async def _is(value: Any, wanted: str) -> bool:
    return bool(await value == wanted)


async def test_an_operator_token_writes_its_own_group_and_nothing_else(server: RunningServer, tmp_path: Path) -> None:
    token = server.token_file.read_text().strip()
    async with open_runtime(data_dir=server.data_dir) as admin:
        client = await admin.resource_client()
        await client.create(TASKS, _task_object("task-3"), namespace="default")
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as http:
        made = await http.post("/v1/tokens", json={"actor": "operator:longhorizon"})
        other = await http.post("/v1/tokens", json={"actor": "operator:router"})
    ca_pem = (server.data_dir / "resources-api" / "ca.crt").read_bytes()

    def kubeconfig(secret: str) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load(render_kubeconfig(server.api_url, ca_pem, secret))
        return loaded

    async with open_runtime(server.url, token=made.json()["token"], kubeconfig=kubeconfig(made.json()["token"])) as rt:
        await rt.ensure_crds(crds())  # its own group: allowed
        task = Task.from_object(await (await rt.resource_client()).get(TASKS, "task-3", namespace="default"))
        run = await rt.resources(Run).create(_run("task-3"), owner=task)
        await rt.resources(Run).patch_status("task-3", {"phase": "Receiving"})
        assert run.metadata.uid
    async with open_runtime(
        server.url, token=other.json()["token"], kubeconfig=kubeconfig(other.json()["token"])
    ) as intruder:
        assert (await intruder.resources(Run).get("task-3")).metadata.uid == run.metadata.uid  # reading is open
        with pytest.raises(Forbidden):
            await intruder.resources(Run).patch_status("task-3", {"phase": "Stopped"})
        assert len(await intruder.ensure_crds(crds())) == 3  # nothing to change: nothing written, allowed
        changed = crds()[0]
        changed["spec"]["names"]["shortNames"] = ["taken"]
        with pytest.raises(Forbidden):
            await intruder.ensure_crds([changed])


def test_resource_errors_map_onto_the_runtimes_tree() -> None:
    import loopd.resources as kube
    from loopd.resources.client import ServerError, TooManyRequests, TransportError
    from loopd.runtime import CapacityFull, InvalidRequest, RuntimeApiError, Unauthorized, Unavailable
    from loopd.runtime._errors import error_from_resource

    cause = kube.Cause("FieldValueInvalid", 'Invalid value: "object": spec is immutable', "spec")
    cases: list[tuple[kube.ResourceError, type[RuntimeApiError], int]] = [
        (kube.NotFound("gone"), NotFound, 404),
        (kube.AlreadyExists("there"), AlreadyExists, 409),
        (kube.Conflict("stale"), Conflict, 409),
        (kube.Invalid("bad", causes=(cause,)), Invalid, 422),
        (kube.BadRequest("malformed"), InvalidRequest, 400),
        (kube.Forbidden("no"), Forbidden, 403),
        (kube.Unauthorized("who"), Unauthorized, 401),
        (kube.StoreUnavailable("down"), Unavailable, 503),
        (TransportError("no answer"), Unavailable, 0),
        (ServerError("boom"), Unavailable, 500),
        (kube.Gone("expired"), Unavailable, 410),
        (TooManyRequests("slow down", retry_after=2.0), CapacityFull, 429),
    ]
    for error, wanted, status in cases:
        mapped = error_from_resource(error)
        assert type(mapped) is wanted and mapped.status == status and mapped.message == error.message, error
    invalid = error_from_resource(kube.Invalid("bad", causes=(cause,)))
    assert isinstance(invalid, Invalid) and invalid.causes == (("FieldValueInvalid", "spec", cause.message),)
    assert isinstance(invalid, InvalidRequest)
    slow = error_from_resource(TooManyRequests("slow down", retry_after=2.0))
    assert isinstance(slow, CapacityFull) and slow.retry_after == 2.0 and slow.retryable


async def test_watch_skips_objects_being_deleted_and_requeues_on_runtime_errors() -> None:
    memory = InMemoryClient()
    try:
        async with open_runtime("http://127.0.0.1:9", token="unused", resources=memory) as rt:  # no loop-server call
            await rt.ensure_crds(crds())
            runs = rt.resources(Run)
            leaving = _run("leaving")
            leaving.metadata.finalizers = ["test/hold"]
            await runs.create(leaving)
            await runs.delete("leaving")  # held by its finalizer: being deleted, never reconciled
            await runs.create(_run("flaky"))
            seen: list[str] = []

            async def reconcile(run: Run) -> Result | None:
                seen.append(run.metadata.name or "")
                if seen.count("flaky") == 1:
                    raise Conflict("someone wrote it first", status=409)
                return None

            rt.watch(Run, reconcile)
            runner = asyncio.create_task(rt.run())
            try:
                await eventually(lambda: seen.count("flaky") >= 2, what="the flaky Run to be retried")
            finally:
                rt.shutdown()
                await asyncio.wait_for(runner, 30)
            assert "leaving" not in seen
            (manager,) = rt.managers
            (controller,) = manager.statistics().controllers
            assert controller.temporary_errors == 1 and controller.failed == 1
    finally:
        await memory.aclose()
