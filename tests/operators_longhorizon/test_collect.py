"""The retention TTL on virtual time: a finished Run is deleted by the Run watch once its TTL has passed (with its
Executions and Audits), a live one never; over the in-memory Kubernetes twin, no loop-server needed."""

from __future__ import annotations

import asyncio

from loopd._infra.clock import VirtualClock
from loopd.operators.longhorizon import LongHorizon, LongHorizonSettings, crds
from loopd.operators.longhorizon._resources import (
    Execution,
    ExecutionSpec,
    ObjectRef,
    Run,
    RunSpec,
    RunStatus,
)
from loopd.resources import ObjectMeta
from loopd.resources.client import InMemoryClient
from loopd.runtime import open_runtime
from tests.support.waiting import eventually

HOUR = 3600.0


def a_run(name: str, phase: str, finished: str | None) -> Run:
    return Run(
        metadata=ObjectMeta(name=name),
        spec=RunSpec(conversation=ObjectRef(name="c1"), inputMessageID=f"in-{name}", goal="g"),
        status=RunStatus(phase=phase, finished_at=finished),  # type: ignore[arg-type]
    )


async def test_finished_runs_are_deleted_after_the_retention_ttl_and_live_ones_are_kept() -> None:
    clock = VirtualClock()
    client = InMemoryClient(clock=clock)
    async with open_runtime("http://127.0.0.1:9", token="unused", resources=client, clock=clock) as rt:
        await rt.ensure_crds(crds())
        lh = LongHorizon(rt, LongHorizonSettings(retention_ttl=HOUR))
        runs = rt.resources(Run)
        stamp = clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        done = await runs.create(a_run("done", "Succeeded", None))
        done = await runs.replace_status(done.model_copy(update={"status": a_run("x", "Succeeded", stamp).status}))
        live = await runs.create(a_run("live", "Executing", None))
        await runs.replace_status(live.model_copy(update={"status": a_run("x", "Executing", None).status}))
        child = Execution(
            metadata=ObjectMeta(name="done-r1"), spec=ExecutionSpec(run="done", round=1, contract_version=1, plan="p")
        )
        await rt.resources(Execution).create(child, owner=done)

        rt.watch(Run, lh.collect, workers=1)
        runner = asyncio.create_task(rt.run(), name="runtime")
        try:
            await clock.advance(HOUR - 60)
            assert {r.metadata.name for r in await runs.list()} == {"done", "live"}

            await clock.advance(120)

            async def collected() -> bool:
                return await runs.find("done") is None and not await rt.resources(Execution).list()

            await eventually(collected, timeout=10, what="the finished Run and its Execution to be deleted")
            assert {r.metadata.name for r in await runs.list()} == {"live"}
        finally:
            rt.shutdown()
            await runner
