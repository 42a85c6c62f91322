"""A LongHorizon operator on its own runtime against a real loop-server on loopback (`open_loop_server`).

The operator's runtime uses the data directory's admin token acting as ``operator:longhorizon``; its Runs live in the
embedded Kubernetes API (CRDs ensured at start). The model is the demo model taught the three roles' prompts
(`demo_rules()`), or a scripted OpenAI-compatible server whose replies a test shapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loopd.harness.models import (
    DemoRule,
    IncomingRequest,
    ModelConfig,
    ScriptedServer,
    ServerReply,
    open_scripted_server,
)
from loopd.operators.longhorizon import crds
from loopd.operators.longhorizon._demo import demo_rules
from loopd.operators.longhorizon._operator import LongHorizon
from loopd.operators.longhorizon._resources import Audit, Execution, Run
from loopd.operators.longhorizon._settings import LongHorizonSettings
from loopd.operators.longhorizon._store import RunStore
from loopd.runtime import Message, Result, Runtime, Task, open_runtime
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from loopd.server.storage import HarnessCall
from tests.support.waiting import eventually

__all__ = ["HELLO", "Rig", "Served", "attached", "demo_rules", "rig", "scripted_model", "served"]

HELLO = "Create hello.txt containing hello world"


class Recording:
    """The operator, recording each Task it reconciles (to find its Run and calls afterwards)."""

    def __init__(self, operator: LongHorizon, seen: dict[str, Task]) -> None:
        self._operator = operator
        self._seen = seen

    async def reconcile(self, task: Task) -> Result | None:
        self._seen[task.id] = task
        return await self._operator.reconcile(task)


class OperatorProcess:
    """One LongHorizon operator (its runtime, its watches), like one `loopd operator longhorizon`."""

    def __init__(
        self,
        server: RunningServer,
        settings: LongHorizonSettings,
        seen: dict[str, Task],
        *,
        store: StoreFactory | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._server = server
        self._settings = settings
        self._seen = seen
        self._store = store
        self._transport = transport
        self._stack = AsyncExitStack()
        self._run: asyncio.Task[None] | None = None
        self.operator: LongHorizon | None = None

    async def __aenter__(self) -> Runtime:
        rt = await self._stack.enter_async_context(
            open_runtime(data_dir=self._server.data_dir, request_timeout=15, transport=self._transport)
        )
        await rt.ensure_crds(crds())
        operator = self.operator = LongHorizon(rt, self._settings)
        if self._store is not None:
            operator.store = self._store(rt)
        await operator.register()
        rt.task.watch("longhorizon", Recording(operator, self._seen), workers=2)
        rt.watch(Run, operator.collect, workers=1)
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._run = group.create_task(rt.run(), name="longhorizon-runtime")
        self._stack.callback(rt.shutdown)
        return rt

    async def kill(self) -> None:
        """Stop at once, like kill -9: its reconciles stop wherever they are (the server's calls go on)."""
        if self._run is not None:
            self._run.cancel()
        await self._stack.aclose()

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()


@dataclass
class Rig:
    """A running loop-server with a LongHorizon operator attached."""

    server: RunningServer
    http: httpx.AsyncClient
    process: OperatorProcess
    rt: Runtime
    settings: LongHorizonSettings
    tasks: dict[str, Task] = field(default_factory=dict)

    @property
    def operator(self) -> LongHorizon:
        assert self.process.operator is not None
        return self.process.operator

    async def restart(self) -> None:
        """Kill the operator and start another one on the same server (plain store, plain transport)."""
        await self.process.kill()
        self.process = OperatorProcess(self.server, self.settings, self.tasks)
        self.rt = await self.process.__aenter__()

    async def ask(self, text: str, conversation: str | None = None) -> dict[str, Any]:
        """Ask operator:longhorizon as the data directory's user; the chat request (task id, conversation, …)."""
        if conversation is None:
            conversation = (await self.http.post("/v1/conversations", json={"name": text[:40]})).json()["id"]
        body = {"target": {"kind": "operator", "key": "longhorizon"}, "text": text}
        answer = await self.http.post(f"/v1/conversations/{conversation}/messages", json=body)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    async def finished(self, asked: dict[str, Any], *, timeout: float = 45) -> dict[str, Any]:
        """The response once it is no longer streaming (the Task completed)."""
        conversation, response_id = asked["conversation_id"], asked["response"]["id"]

        async def response() -> dict[str, Any] | None:
            page = await self.http.get(f"/v1/conversations/{conversation}/messages", params={"limit": 200})
            found = next(m for m in page.json()["data"] if m["id"] == response_id)
            return None if found["status"] == "streaming" else dict(found)

        return await eventually(response, timeout=timeout, what="the LongHorizon answer")

    async def run(self, name: str) -> Run | None:
        return await self.rt.resources(Run).find(name)

    async def wait_run(self, name: str, check: Callable[[Run], bool], *, what: str, timeout: float = 45) -> Run:
        async def probe() -> Run | None:
            run = await self.run(name)
            return run if run is not None and check(run) else None

        return await eventually(probe, timeout=timeout, what=what)

    async def executions(self, run: str) -> list[Execution]:
        return [e for e in await self.rt.resources(Execution).list() if e.spec.run == run]

    async def audits(self, run: str) -> list[Audit]:
        return [a for a in await self.rt.resources(Audit).list() if a.spec.run == run]

    async def calls(self, owner_uid: str) -> list[HarnessCall]:
        return await self.server.engine.list_by_owner(owner_uid)

    async def reply(self, asked: dict[str, Any], outcome: str, value: str | None = None) -> None:
        """Answer the Task's pending question as its user (``success`` with ``value``, or ``dismissed``)."""
        question = await self.pending_question(asked["task_id"])
        body: dict[str, Any] = {"reply_to_message_id": question.id, "outcome": outcome}
        if value is not None:
            body["value"] = value
        path = f"/v1/conversations/{asked['conversation_id']}/tasks/{asked['task_id']}/replies"
        answer = await self.http.post(path, json=body)
        assert answer.status_code == 200, answer.text

    async def pending_question(self, task_id: str, *, timeout: float = 45) -> Message:
        async def probe() -> Message | None:
            for message in reversed(await self.messages(task_id)):
                if message.purpose == "human_request":
                    state = (await self.http.get(f"/v1/human/{message.id}")).json()
                    if state["status"] == "pending":
                        return message
            return None

        return await eventually(probe, timeout=timeout, what="a question to the user")

    async def messages(self, task_id: str) -> list[Message]:
        found: list[Message] = []
        after: str | None = None
        while True:
            page = await self.rt.task.messages(task_id, after=after, limit=100)
            found += page
            if len(page) < 100:
                return found
            after = page[-1].id


@dataclass
class Served:
    """A running loop-server and an admin HTTP client to it (shared by the operators of several tests)."""

    server: RunningServer
    http: httpx.AsyncClient


@asynccontextmanager
async def served(
    tmp_path: Path, *, rules: tuple[DemoRule, ...] = (), model: ModelConfig | None = None
) -> AsyncIterator[Served]:
    """A loop-server on loopback whose demo model knows ``rules``."""
    up = UpSettings(data_dir=tmp_path / "data", port=0, demo_rules=rules, model=model or ModelConfig())
    async with open_loop_server(up) as server:
        token = server.token_file.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=15) as http:
            yield Served(server, http)


@asynccontextmanager
async def attached(
    on: Served,
    *,
    settings: LongHorizonSettings | None = None,
    store: StoreFactory | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Rig]:
    """A LongHorizon operator on ``on``'s server for the block (stopped at its end)."""
    lh = settings or LongHorizonSettings(concurrency=2)
    seen: dict[str, Task] = {}
    process = OperatorProcess(on.server, lh, seen, store=store, transport=transport)
    rt = await process.__aenter__()
    state = Rig(on.server, on.http, process, rt, lh, seen)
    try:
        yield state
    finally:
        await state.process.__aexit__()


@asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    rules: tuple[DemoRule, ...] = (),
    model: ModelConfig | None = None,
    settings: LongHorizonSettings | None = None,
    store: StoreFactory | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Rig]:
    """A server of its own with an operator attached."""
    async with (
        served(tmp_path, rules=rules, model=model) as on,
        attached(on, settings=settings, store=store, transport=transport) as r,
    ):
        yield r


Reply = Callable[[IncomingRequest], ServerReply]
StoreFactory = Callable[[Runtime], RunStore]


@asynccontextmanager
async def scripted_model(reply: Reply) -> AsyncIterator[ModelConfig]:
    """A scripted OpenAI-compatible model answering every request with ``reply(request)``."""
    async with open_scripted_server(ScriptedServer(reply)) as base_url:
        yield ModelConfig(model="longhorizon-test", base_url=base_url, timeout=30, max_retries=0)
