"""`kubectl get tasks` shows who holds a Task and in which phase, as the harness responder reports it through the
status subresource (never any content); `kubectl explain` describes the Task's fields."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loopd.resources import NotFound as ResourceNotFound
from loopd.resources.client import TASKS, StoreClient
from loopd.resources.reconcile import Manager
from loopd.server.engine import Finished, GateOpened, HarnessEngine, TextSet
from loopd.server.responder import HarnessResponder
from loopd.server.storage import ConversationFork, Database, DatabaseOptions, Message, NewMessage, open_database
from loopd.server.streams import ConversationBus, empty_model, finish, open_message
from tests.resources.conftest import RunningApi
from tests.server_engine.conftest import ScriptedAdapter, make_engine, scripted
from tests.support.kubectl import Kubectl
from tests.support.waiting import eventually

pytestmark = pytest.mark.kubectl


@dataclass(frozen=True)
class _Context:
    input: Message
    response: Message
    history: Sequence[Message]
    fork: ConversationFork | None = None
    conversation_mode: str | None = None
    has_earlier: bool = False


@dataclass
class _Chat:
    """The two chat operations the responder needs, on storage (the question is stored before the Task)."""

    db: Database
    client: StoreClient
    bus: ConversationBus

    async def task_context(self, task_id: str, *, history: int | None = None) -> _Context:
        async with self.db.transaction(read_only=True) as tx:
            input_, response = await tx.messages.task_pair(task_id)
        return _Context(input_, response, [])

    async def complete(
        self,
        task_id: str,
        *,
        error: Mapping[str, str] | None = None,
        response_id: str | None = None,
        later: bool = False,
    ) -> None:
        async with self.db.transaction() as tx:
            _, response = await tx.messages.task_pair(task_id)
            await finish(tx, response.id, "failed" if error else "completed", error=error, bus=self.bus)
        with contextlib.suppress(ResourceNotFound):
            await self.client.delete(TASKS, task_id, namespace="default")


async def _question(db: Database, task_id: str) -> None:
    async with db.transaction() as tx:
        conversation = await tx.conversations.create(actor_kind="user", actor_key="alice")
        asked = await open_message(
            tx,
            NewMessage(
                conversation_id=conversation.id,
                kind="user",
                key="alice",
                purpose="input",
                content={**empty_model(), "blocks": [{"id": "text", "type": "text", "content": "secret question"}]},
                task_id=task_id,
            ),
        )
        await open_message(
            tx,
            NewMessage(
                conversation_id=conversation.id,
                kind="harness",
                key="assistant",
                purpose="response",
                content=empty_model(),
                task_id=task_id,
                reply_to_message_id=asked.id,
                status="streaming",
            ),
        )


@dataclass
class _Responding:
    db: Database
    client: StoreClient
    engine: HarnessEngine
    adapter: ScriptedAdapter


@pytest.fixture
async def responding(api: RunningApi, tmp_path: Path) -> AsyncIterator[_Responding]:
    """A harness responder on the API's own store; the harness says something, parks, then asks for a gate."""
    bus = ConversationBus()
    adapter = ScriptedAdapter(
        script=scripted(TextSet("working"), None, GateOpened("g1", "run ls?"), None, Finished("done"))
    )
    options = DatabaseOptions(operation_timeout=30.0)
    async with open_database(tmp_path / "loopd.db", options=options) as db:
        client = StoreClient(api.store)
        async with make_engine(db, {"assistant": adapter}, bus=bus) as engine:
            responder = HarnessResponder(client=client, engine=engine, chat=_Chat(db, client, bus), poll=0.05)
            manager = Manager(client)
            manager.add_controller(TASKS, responder, workers=1)
            running = asyncio.ensure_future(manager.run())
            try:
                yield _Responding(db, client, engine, adapter)
            finally:
                manager.shutdown()
                await asyncio.wait_for(running, 10)


def _row(table: str, name: str) -> dict[str, str]:
    lines = table.splitlines()
    header = lines[0].split()
    for line in lines[1:]:
        cells = line.split()
        if cells and cells[0] == name:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"no row {name!r} in:\n{table}")


async def _until_phase(kubectl: Kubectl, name: str, phase: str) -> dict[str, Any]:
    async def in_phase() -> dict[str, Any] | None:
        task = json.loads(await kubectl.ok("get", "task", name, "-o", "json"))
        return dict(task) if (task.get("status") or {}).get("phase") == phase else None

    found: dict[str, Any] = await eventually(in_phase, timeout=15.0, what=f"task {name} in phase {phase}")
    return found


async def test_kubectl_get_tasks_shows_who_holds_a_task_and_its_phase(
    kubectl: Kubectl, responding: _Responding
) -> None:
    await _question(responding.db, "t-1")
    task = {
        "apiVersion": TASKS.api_version,
        "kind": TASKS.kind,
        "metadata": {"name": "t-1", "namespace": "default"},
        "spec": {"target": {"kind": "harness", "key": "assistant"}, "revision": 1},
    }
    await responding.client.create(TASKS, task, namespace="default")

    running = await _until_phase(kubectl, "t-1", "Running")
    status = running["status"]
    assert set(status) == {"phase", "responder", "startedAt"}  # who, since when — and no content
    assert status["responder"] == "harness:assistant"
    started = datetime.fromisoformat(status["startedAt"].replace("Z", "+00:00"))
    assert started.tzinfo is not None and started <= datetime.now(UTC)
    assert "secret question" not in json.dumps(running)
    row = _row(await kubectl.ok("get", "tasks"), "t-1")
    assert (row["PHASE"], row["RESPONDER"], row["TARGET"]) == ("Running", "harness:assistant", "assistant")

    (call_id,) = responding.adapter.starts
    responding.adapter.last_run(call_id).release()  # the harness opens a permission gate: it waits for a person
    waiting = await _until_phase(kubectl, "t-1", "WaitingInput")
    assert waiting["status"]["startedAt"] == status["startedAt"]  # still held since then
    assert _row(await kubectl.ok("get", "tasks"), "t-1")["PHASE"] == "WaitingInput"


async def test_kubectl_explain_describes_the_task(kubectl: Kubectl) -> None:
    spec = await kubectl.ok("explain", "tasks.spec")
    assert "Which responder answers the Task" in spec
    for field, words in (("target", "Who responds to the Task"), ("revision", "Wake revision")):
        assert field in spec and words in spec
    assert "-required-" in spec.split("target", 1)[1].splitlines()[0]
    status = await kubectl.ok("explain", "tasks.status")
    for field in ("phase", "responder", "startedAt"):
        assert field in status
    assert "Who holds the Task" in status
    top = await kubectl.ok("explain", "tasks")
    assert "<no description>" not in top
