"""``task.watch``: one reconciler, run (a) over the in-memory resource client and (b) over the embedded Kubernetes
API over TLS (the kubeconfig of the data directory), answering questions of a real loop-server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from loopd._infra.clock import VirtualClock
from loopd.resources.client import TASKS, InMemoryClient, ResourceClient, task_target_labels
from loopd.resources.reconcile import ManagerStatistics
from loopd.runtime import Conflict, Result, Runtime, Task, open_runtime
from loopd.runtime._tasks import CLAIM_DELAY
from loopd.server._composition import RunningServer
from tests.reconcile.helpers import DeliveredClient
from tests.support.waiting import eventually

from .conftest import User


class Echo:
    """The reconciler under test: answers with the question, idempotently; ``fail_first`` raises once per Task."""

    def __init__(self, rt: Runtime, fail_first: Callable[[Task], Exception] | None = None) -> None:
        self.rt = rt
        self.seen: list[Task] = []
        self.fail_first = fail_first
        self.failed: set[str] = set()

    async def reconcile(self, task: Task) -> Result | None:
        self.seen.append(task)
        if self.fail_first is not None and task.id not in self.failed:
            self.failed.add(task.id)
            raise self.fail_first(task)
        context = await self.rt.task.get(task.id)
        if context.response.status == "streaming":
            await self.rt.chat.answer(task.id, context.input.text)
        await self.rt.chat.complete(task.id)
        return None


def _task_object(name: str, key: str = "echo") -> dict[str, Any]:
    return {
        "apiVersion": "loopd.dev/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"target": {"kind": "operator", "key": key}, "revision": 1},
    }


@asynccontextmanager
async def _running(rt: Runtime) -> AsyncIterator[None]:
    runner = asyncio.create_task(rt.run())
    await eventually(lambda: rt.managers and all(m.leading for m in rt.managers), what="the watch to start")
    try:
        yield
    finally:
        rt.shutdown()
        await asyncio.wait_for(runner, 30)


def _stats(rt: Runtime) -> ManagerStatistics:
    (manager,) = rt.managers
    return manager.statistics()


async def _answered(user: User, asked: dict[str, Any]) -> dict[str, Any]:
    async def completed() -> dict[str, Any] | None:
        found = await user.message(asked["conversation_id"], asked["response"]["id"])
        return found if found["status"] != "streaming" else None

    return await eventually(completed, timeout=30, what="the answer")


@pytest.mark.parametrize("api", ["memory", "embedded"])
async def test_the_same_reconciler_answers_through_either_resource_client(
    api: str, server: RunningServer, user: User
) -> None:
    memory = InMemoryClient() if api == "memory" else None
    async with open_runtime(data_dir=server.data_dir, resources=memory) as rt:
        await rt.register("echo")
        echo = Echo(rt)
        rt.task.watch("echo", echo, workers=2)
        async with _running(rt):
            asked = [await user.ask(f"question {i}") for i in range(3)]
            if memory is not None:  # the twin holds what the server's store holds for these Tasks
                for question in asked:
                    await memory.create(TASKS, _task_object(question["task_id"]), namespace="default")
            for question in asked:
                answer = await _answered(user, question)
                assert answer["status"] == "completed"
                assert answer["content"]["blocks"] == [
                    {"id": "answer", "type": "text", "content": question["input"]["content"]["blocks"][0]["content"]}
                ]
            if memory is not None:
                # Echo completes each Task before its claim is due: a completed Task is deleted, never claimed.
                for question in asked:
                    assert "status" not in await memory.get(TASKS, question["task_id"], namespace="default")
                await memory.aclose()
        seen = {task.id for task in echo.seen}
        assert seen == {question["task_id"] for question in asked}
        assert all(t.target_key == "echo" and t.uid and t.namespace == "default" for t in echo.seen)
        (controller,) = _stats(rt).controllers
        assert controller.failed == 0


async def test_the_status_is_written_once_the_reconcile_has_run_a_moment_or_at_its_end(server: RunningServer) -> None:
    """The claim waits CLAIM_DELAY (virtual time here), so it never competes with a reconcile's first reads; a
    reconcile that ends sooner is claimed at its end; startedAt is when the reconcile began either way."""
    memory = InMemoryClient()
    clock = VirtualClock()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(task: Task) -> Result | None:
        if task.id == "slow":
            entered.set()
            await release.wait()
        return None

    async def status(name: str) -> dict[str, Any]:
        return dict((await memory.get(TASKS, name, namespace="default")).get("status") or {})

    async with open_runtime(data_dir=server.data_dir, resources=memory, clock=clock) as rt:
        rt.task.watch("echo", slow)
        async with _running(rt):
            await memory.create(TASKS, _task_object("slow"), namespace="default")
            await asyncio.wait_for(entered.wait(), 10)
            await clock.advance(CLAIM_DELAY / 2)
            assert await status("slow") == {}, "not written while the reconcile has just begun"
            await clock.advance(CLAIM_DELAY / 2)
            await eventually(lambda: _phase(memory, "slow"), what="the status written after the delay")
            assert (await status("slow"))["startedAt"] == "2030-01-01T00:00:00Z"
            release.set()
            await memory.create(TASKS, _task_object("quick"), namespace="default")
            await eventually(lambda: _phase(memory, "quick"), what="a quick reconcile claimed at its end")
            assert (await status("quick"))["responder"] == "operator:echo"
    await memory.aclose()


async def test_a_task_completed_before_its_claim_is_due_is_never_claimed(server: RunningServer, user: User) -> None:
    """The server deletes a Task when it is completed: writing who holds it afterwards would be wasted work beside
    the answer's last steps (and a write to a Task being deleted)."""
    memory = InMemoryClient()
    clock = VirtualClock()
    async with open_runtime(data_dir=server.data_dir, resources=memory, clock=clock) as rt:
        await rt.register("echo")
        completed: list[str] = []
        release = asyncio.Event()

        async def answer_then_linger(task: Task) -> Result | None:
            await rt.chat.complete(task.id, answer="done")
            completed.append(task.id)
            await release.wait()  # still reconciling when the claim would be due
            return None

        rt.task.watch("echo", answer_then_linger)
        async with _running(rt):
            asked = await user.ask("quick one")
            await memory.create(TASKS, _task_object(asked["task_id"]), namespace="default")
            await eventually(lambda: _true(bool(completed)), what="the Task completed")
            await clock.advance(CLAIM_DELAY * 2)
            release.set()
            answer = await _answered(user, asked)
            assert answer["status"] == "completed"
            assert "status" not in await memory.get(TASKS, asked["task_id"], namespace="default")
    await memory.aclose()


async def _true(value: bool) -> bool:
    return value


async def _phase(memory: InMemoryClient, name: str) -> bool:
    return ((await memory.get(TASKS, name, namespace="default")).get("status") or {}).get("phase") == "Running"


async def test_tasks_of_others_and_tasks_being_deleted_are_skipped(server: RunningServer) -> None:
    memory = InMemoryClient()
    async with open_runtime(data_dir=server.data_dir, resources=memory) as rt:
        await rt.register("echo")
        echo = Echo(rt)
        rt.task.watch("echo", echo)
        leaving = {**_task_object("leaving"), "metadata": {"name": "leaving", "finalizers": ["test/hold"]}}
        await memory.create(TASKS, leaving, namespace="default")
        await memory.delete(TASKS, "leaving", namespace="default")  # held by its finalizer: being deleted
        await memory.create(TASKS, _task_object("theirs", key="other"), namespace="default")
        async with _running(rt):
            await eventually(lambda: _stats(rt).controllers[0].reconciles >= 2, what="both Tasks reconciled")
        assert echo.seen == []
        assert "status" not in await memory.get(TASKS, "theirs", namespace="default")
    await memory.aclose()


async def test_a_task_whose_question_has_not_committed_is_requeued_shortly(server: RunningServer) -> None:
    memory = InMemoryClient()
    async with open_runtime(data_dir=server.data_dir, resources=memory) as rt:
        await rt.register("echo")
        echo = Echo(rt)
        rt.task.watch("echo", echo)
        await memory.create(TASKS, _task_object("not-committed-yet"), namespace="default")
        async with _running(rt):
            await eventually(lambda: len(echo.seen) >= 4, what="four reconciles of the waiting Task")
        (controller,) = _stats(rt).controllers
        assert controller.failed == 0 and controller.requeued >= 3  # requeued, never counted as an error
    await memory.aclose()


async def test_a_reconcilers_typed_error_is_requeued_with_backoff_and_logged_with_the_task_id(
    server: RunningServer, user: User, caplog: pytest.LogCaptureFixture
) -> None:
    def conflict(task: Task) -> Exception:
        return Conflict(f"output of {task.id} was opened with other parameters", type="conflict")

    caplog.set_level(logging.INFO, logger="loopd")
    async with open_runtime(data_dir=server.data_dir) as rt:
        await rt.register("echo")
        echo = Echo(rt, fail_first=conflict)
        rt.task.watch("echo", echo)
        async with _running(rt):
            asked = await user.ask("try again")
            assert (await _answered(user, asked))["status"] == "completed"
        (controller,) = _stats(rt).controllers
    assert controller.temporary_errors == 1 and [t.id for t in echo.seen].count(asked["task_id"]) >= 2
    lines = [r.getMessage() for r in caplog.records if r.name == "loopd.runtime"]
    assert any(asked["task_id"] in line and "Conflict" in line for line in lines), lines


async def test_with_leader_election_only_the_holder_reconciles(server: RunningServer, user: User) -> None:
    memory: ResourceClient = InMemoryClient()
    async with (
        open_runtime(data_dir=server.data_dir, resources=memory) as first,
        open_runtime(data_dir=server.data_dir, resources=memory) as second,
    ):
        echoes = [Echo(first), Echo(second)]
        for rt, echo in zip((first, second), echoes, strict=True):
            await rt.register("echo")
            rt.task.watch("echo", echo, leader_election="echo")
        runners = [asyncio.create_task(rt.run()) for rt in (first, second)]
        try:
            await eventually(
                lambda: sum(m.leading for rt in (first, second) for m in rt.managers) == 1, what="one leader"
            )
            asked = await user.ask("who answers?")
            await memory.create(TASKS, _task_object(asked["task_id"]), namespace="default")
            assert (await _answered(user, asked))["status"] == "completed"
            assert sorted(len(echo.seen) > 0 for echo in echoes) == [False, True]
        finally:
            for rt in (first, second):
                rt.shutdown()
            await asyncio.wait_for(asyncio.gather(*runners), 30)
    await memory.aclose()


async def test_an_operator_token_watches_over_tls_with_leader_election(server: RunningServer, user: User) -> None:
    made = await user.http.post("/v1/tokens", json={"actor": "operator:echo"})
    assert made.status_code == 201, made.text
    # The URL and the operator's own token; the data directory only locates the embedded API and its CA.
    async with open_runtime(server.url, token=made.json()["token"], data_dir=server.data_dir) as rt:
        assert not rt.endpoint.admin
        await rt.register("echo")
        echo = Echo(rt)
        rt.task.watch("echo", echo, leader_election="echo")
        async with _running(rt):
            asked = await user.ask("as myself")
            answer = await _answered(user, asked)
        assert answer["status"] == "completed" and [t.id for t in echo.seen][:1] == [asked["task_id"]]
        leader = _stats(rt).leader
        assert leader is not None and leader.acquisitions == 1


def _labelled(name: str, kind: str, key: str) -> dict[str, Any]:
    body = _task_object(name, key)
    body["spec"]["target"]["kind"] = kind
    body["metadata"]["labels"] = task_target_labels(kind, key)
    return body


async def test_the_harnesses_tasks_are_never_sent_to_an_operators_watch(server: RunningServer) -> None:
    """The watch selects on the server (``loopd.dev/target-kind!=harness``): a chat server's Tasks for its
    harnesses are not listed, sent or cached by any operator; unlabelled Tasks (older ones) still arrive."""
    memory = InMemoryClient()
    delivered = DeliveredClient(memory)
    seen: list[str] = []

    async def record(task: Task) -> Result | None:
        seen.append(task.id)
        return None

    await memory.create(TASKS, _labelled("chat-before", "harness", "assistant"), namespace="default")
    async with open_runtime(data_dir=server.data_dir, resources=delivered) as rt:
        rt.task.watch("echo", record)
        async with _running(rt):
            await memory.create(TASKS, _labelled("chat-after", "harness", "assistant"), namespace="default")
            await memory.create(TASKS, _task_object("unlabelled"), namespace="default")
            await memory.create(TASKS, _labelled("mine", "operator", "echo"), namespace="default")
            await eventually(lambda: _true({"unlabelled", "mine"} <= set(seen)), what="both Tasks reconciled")
    assert delivered.names == {"unlabelled", "mine"}
    await memory.aclose()


async def test_the_operators_tasks_are_never_sent_to_the_servers_harness_responder(
    server: RunningServer, user: User
) -> None:
    """The other way round: the loop-server's responder watches ``loopd.dev/target-kind!=operator``. Questions to
    an operator nobody serves yet are never reconciled by it; one question to a harness is."""
    assert server.metrics is not None
    async with open_runtime(data_dir=server.data_dir) as rt:
        await rt.register("echo")  # known, but not watching
    for i in range(6):
        await user.ask(f"for an operator {i}")
    harness_question = (await user.http.post("/v1/conversations", json={"name": "h"})).json()["id"]
    asked = await user.http.post(
        f"/v1/conversations/{harness_question}/messages",
        json={"target": {"kind": "harness", "key": "assistant"}, "text": "hello"},
    )
    assert asked.status_code == 201, asked.text
    answer = await _answered(user, asked.json())
    assert answer["status"] == "completed"
    labels = {"component": "server", "controller": "tasks.0"}
    reconciles = server.metrics.registry.get_sample_value("loopd_reconcile_seconds_count", labels)
    assert reconciles is not None and 1 <= reconciles < 6, reconciles
