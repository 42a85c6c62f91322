"""The Router through loopd.runtime against a real loop-server on loopback (`open_loop_server`, in process).

The Router's runtime uses the data directory's admin token acting as ``operator:router``. The model is either the
demo model taught the Router's prompts (``UpSettings.demo_rules`` = `demo_rules()`, as `loopd up` does), or a
scripted OpenAI-compatible server whose replies a test shapes (slow work, an invalid plan, an empty result).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness.models import (
    DemoRule,
    IncomingRequest,
    ModelConfig,
    ScriptedServer,
    ServerReply,
    open_scripted_server,
)
from loopd.operators.router import (
    FOLLOWUP_ANSWER,
    PLAN_HEADER,
    REPLAN_HEADER,
    SUMMARIZE_HEADER,
    WORK_HEADER,
    Router,
    RouterSettings,
    demo_rules,
)
from loopd.runtime import Message, Result, Runtime, Task, open_runtime
from loopd.server._composition import RunningServer, UpSettings, open_loop_server
from loopd.server.storage import HarnessCall
from tests.support.titles import is_title_request, title_reply
from tests.support.waiting import eventually

LIU_BEI = "Introduce Liu Bei, Guan Yu, and Zhang Fei"
NAMES = ("Liu Bei", "Guan Yu", "Zhang Fei")


class RouterProcess:
    """A Router on its own runtime (admin token acting as ``operator:router``), like one `loopd operator router`."""

    def __init__(self, server: RunningServer, seen: dict[str, Task], settings: RouterSettings | None = None) -> None:
        self._server = server
        self._seen = seen
        self._settings = settings or RouterSettings(max_subtasks=4, concurrency=2)
        self._stack = AsyncExitStack()
        self._run: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Runtime:
        rt = await self._stack.enter_async_context(open_runtime(data_dir=self._server.data_dir, request_timeout=15))
        router = Router(rt, self._settings)
        await router.register()
        rt.task.watch("router", Recording(router, self._seen), workers=2)
        group = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._run = group.create_task(rt.run(), name="router-runtime")
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
class Routed:
    """A running loop-server with a Router attached, and the Tasks the Router reconciled."""

    server: RunningServer
    http: httpx.AsyncClient
    router: RouterProcess
    rt: Runtime
    tasks: dict[str, Task] = field(default_factory=dict)

    async def restart(self, settings: RouterSettings | None = None) -> None:
        """Kill the Router and start another one (a new runtime and reconciler on the same server)."""
        await self.router.kill()
        self.router = RouterProcess(self.server, self.tasks, settings)
        self.rt = await self.router.__aenter__()

    async def ask(self, text: str) -> dict[str, Any]:
        """Ask the Router as the data directory's user; the chat request (task id, conversation, response)."""
        conversation = (await self.http.post("/v1/conversations", json={"name": text[:40]})).json()["id"]
        body = {"target": {"kind": "operator", "key": "router"}, "text": text}
        answer = await self.http.post(f"/v1/conversations/{conversation}/messages", json=body)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())

    async def say(self, conversation_id: str, text: str) -> None:
        """A follow-up in the same conversation (to the built-in assistant, so only the Router's Task is watched)."""
        body = {"target": {"kind": "harness", "key": "assistant"}, "text": text}
        answer = await self.http.post(f"/v1/conversations/{conversation_id}/messages", json=body)
        assert answer.status_code == 201, answer.text

    async def finished(self, asked: dict[str, Any]) -> dict[str, Any]:
        """The response once it is no longer streaming (the Task completed)."""
        conversation, response_id = asked["conversation_id"], asked["response"]["id"]

        async def response() -> dict[str, Any] | None:
            page = await self.http.get(f"/v1/conversations/{conversation}/messages", params={"limit": 100})
            found = next(m for m in page.json()["data"] if m["id"] == response_id)
            return None if found["status"] == "streaming" else dict(found)

        return await eventually(response, timeout=45, what="the Router's answer")

    async def calls(self, task_id: str) -> list[HarnessCall]:
        return await self.server.engine.list_by_owner(self.tasks[task_id].uid)

    async def messages(self, task_id: str) -> list[Message]:
        return await self.rt.task.messages(task_id, limit=100)

    async def task_exists(self, task_id: str) -> bool:
        return any(t.task_id == task_id for t in await self.rt.task.list("router"))


class Recording:
    """The Router, recording each Task it reconciles (to find its calls by the Task's UID afterwards)."""

    def __init__(self, router: Router, seen: dict[str, Task]) -> None:
        self._router = router
        self._seen = seen

    async def reconcile(self, task: Task) -> Result | None:
        self._seen[task.id] = task
        return await self._router.reconcile(task)


@asynccontextmanager
async def routed(
    tmp_path: Path, *, rules: tuple[DemoRule, ...] = (), model: ModelConfig | None = None
) -> AsyncIterator[Routed]:
    settings = UpSettings(data_dir=tmp_path / "data", port=0, demo_rules=rules, model=model or ModelConfig())
    async with open_loop_server(settings) as server:
        token = server.token_file.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=15) as http:
            seen: dict[str, Task] = {}
            process = RouterProcess(server, seen)
            rt = await process.__aenter__()
            state = Routed(server, http, process, rt, seen)
            try:
                yield state
            finally:
                await state.router.__aexit__()


Reply = Callable[[str], ServerReply]


@asynccontextmanager
async def scripted_model(reply: Reply) -> AsyncIterator[ModelConfig]:
    """A scripted OpenAI-compatible model answering the Router's prompts with ``reply(prompt)``."""

    def rule(request: IncomingRequest) -> ServerReply:
        if is_title_request(request):  # the conversation's title: not one of the Router's steps
            return title_reply()
        return reply(request.last_user_text)

    async with open_scripted_server(ScriptedServer(rule)) as base_url:
        yield ModelConfig(model="router-test", base_url=base_url, timeout=30, max_retries=0)


def demo_answer(prompt: str) -> str:
    """The demo rules' answer to a Router prompt ("ok" to anything else, e.g. the assistant's own Tasks)."""
    for rule in demo_rules():
        if (said := rule(prompt)) is not None:
            return said
    return "ok"


def progress_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.kind == "operator" and m.content.get("meta", {}).get("phase") == "progress"]


def harness_messages(messages: list[Message]) -> list[Message]:
    return [m for m in messages if m.kind == "harness" and m.purpose == "output"]


async def test_the_liu_bei_question_is_planned_worked_in_parallel_and_summarized(tmp_path: Path) -> None:
    async with routed(tmp_path, rules=demo_rules()) as r:
        asked = await r.ask(LIU_BEI)
        response = await r.finished(asked)
        task_id = asked["task_id"]

        assert response["status"] == "completed"
        answer = next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer")
        for name in NAMES:
            assert name in answer
        assert "Task:" not in answer and "router" not in answer.lower()

        calls = await r.calls(task_id)
        assert sorted(c.effect_key for c in calls) == ["plan", "summarize", "work/0", "work/1", "work/2"]
        assert all(c.phase == "succeeded" for c in calls)
        work = harness_messages(await r.messages(task_id))
        assert len(work) == 5
        assert {m.conversation_id for m in work} != {asked["conversation_id"]}
        assert len({m.conversation_id for m in work}) == 1
        for name in NAMES:
            assert sum(m.text.startswith(f"{name}: ") for m in work) == 1
        assert await eventually(lambda: _gone(r, task_id), what="the Task to be deleted")


async def _gone(r: Routed, task_id: str) -> bool:
    return not await r.task_exists(task_id)


async def test_the_work_calls_run_at_the_same_time(tmp_path: Path) -> None:
    def reply(prompt: str) -> ServerReply:
        # Slow enough that creating the other two calls fits in it even on a loaded machine.
        return ServerReply(text=demo_answer(prompt), delay=5.0 if prompt.startswith(WORK_HEADER) else 0.0)

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask(LIU_BEI)
        response = await r.finished(asked)

        assert response["status"] == "completed"
        work = [c for c in await r.calls(asked["task_id"]) if c.effect_key.startswith("work/")]
        assert len(work) == 3
        # Every work call was created before any of them ended: all three ran at once.
        assert max(c.created_at for c in work) < min(c.updated_at for c in work)


def _plan(tasks: list[str] | str) -> str:
    return tasks if isinstance(tasks, str) else json.dumps({"kind": "complex", "tasks": tasks})


@pytest.mark.parametrize(
    ("plan", "work", "message"),
    [
        (_plan("Sure, let me think about it."), {}, "plan: invalid plan: it is not JSON"),
        (_plan([f"part {i}" for i in range(9)]), {}, "the plan has 9 tasks; at most 4 are allowed"),
        (_plan(["quick", "slow"]), {"quick": ""}, "work/0: the harness call returned an empty result"),
    ],
    ids=["invalid-json", "nine-tasks", "empty-result"],
)
async def test_a_failure_completes_the_task_with_router_failed_and_leaves_nothing_running(
    tmp_path: Path, plan: str, work: dict[str, str], message: str
) -> None:
    def reply(prompt: str) -> ServerReply:
        if prompt.startswith(PLAN_HEADER):
            return ServerReply(text=plan)
        if prompt.startswith(WORK_HEADER):
            task = prompt.rsplit("\nTask:\n", 1)[-1]
            return ServerReply(text=work.get(task, f"done: {task}"), delay=30.0 if task == "slow" else 0.0)
        return ServerReply(text=demo_answer(prompt))

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask("Do the thing")
        response = await r.finished(asked)

        assert response["status"] == "failed"
        error = response["content"]["meta"]["error"]
        assert error["code"] == "router_failed"
        assert message in error["message"]
        calls = await r.calls(asked["task_id"])
        assert all(c.is_terminal for c in calls), [(c.effect_key, c.phase) for c in calls]
        assert "summarize" not in {c.effect_key for c in calls}
        if "slow" in plan:
            slow = next(c for c in calls if c.effect_key == "work/1")
            assert slow.phase == "cancelled"
        assert await eventually(lambda: _gone(r, asked["task_id"]), what="the Task to be deleted")


async def test_a_followup_during_the_work_gets_a_progress_message_and_a_replan(tmp_path: Path) -> None:
    started = asyncio.Event()

    def reply(prompt: str) -> ServerReply:
        if prompt.startswith(WORK_HEADER) and "Follow-ups" not in prompt:
            started.set()
            return ServerReply(text=demo_answer(prompt), delay=5.0)  # the follow-up must land while it runs
        return ServerReply(text=demo_answer(prompt))

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask(LIU_BEI)
        await eventually(started.is_set, what="the first work call")
        await r.say(asked["conversation_id"], "Also introduce Cao Cao")
        response = await r.finished(asked)

        assert response["status"] == "completed"
        keys = sorted(c.effect_key for c in await r.calls(asked["task_id"]))
        assert keys == ["plan", "plan/1", "summarize", "work/0", "work/1", "work/1/0", "work/2"]
        messages = await r.messages(asked["task_id"])
        progress = progress_messages(messages)
        assert len(progress) == 1
        assert progress[0].conversation_id == asked["conversation_id"]
        assert progress[0].content["meta"]["round"] == 1
        answer = next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer")
        assert "Cao Cao" in answer


async def test_a_question_to_the_router_while_it_works_is_answered_once_by_the_work_in_progress(
    tmp_path: Path,
) -> None:
    started = asyncio.Event()

    def reply(prompt: str) -> ServerReply:
        if prompt.startswith(WORK_HEADER) and "Follow-ups" not in prompt:
            started.set()
            return ServerReply(text=demo_answer(prompt), delay=5.0)  # the second question lands while it runs
        return ServerReply(text=demo_answer(prompt))

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        first = await r.ask(LIU_BEI)
        await eventually(started.is_set, what="the first work call")
        body = {"target": {"kind": "operator", "key": "router"}, "text": "Also introduce Cao Cao"}
        said = await r.http.post(f"/v1/conversations/{first['conversation_id']}/messages", json=body)
        assert said.status_code == 201, said.text
        second = dict(said.json())

        answer = await r.finished(first)
        assert "Cao Cao" in next(b["content"] for b in answer["content"]["blocks"] if b["id"] == "answer")
        note = await r.finished(second)  # the second Task is not worked again: the first answer covers it
        assert note["status"] == "completed"
        assert [b.get("content") for b in note["content"]["blocks"] if b["id"] == "answer"] == [FOLLOWUP_ANSWER]
        assert second["task_id"] in r.tasks and await r.calls(second["task_id"]) == []


class Asked:
    """What the scripted model was asked, per Router step (``plan``, ``work/<task>``, ``summarize``)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def step(self, prompt: str) -> str:
        if prompt.startswith((PLAN_HEADER, REPLAN_HEADER)):
            step = "plan"
        elif prompt.startswith(WORK_HEADER):
            step = "work/" + prompt.rsplit("\nTask:\n", 1)[-1]
        elif prompt.startswith(SUMMARIZE_HEADER):
            step = "summarize"
        else:
            step = "other"
        self.counts[step] += 1
        return step


async def test_a_restarted_router_reattaches_to_its_calls_and_makes_none_twice(tmp_path: Path) -> None:
    asked_model = Asked()

    def reply(prompt: str) -> ServerReply:
        step = asked_model.step(prompt)
        return ServerReply(text=demo_answer(prompt), delay=1.5 if step.startswith("work/") else 0.0)

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask(LIU_BEI)
        await eventually(lambda: sum(n for s, n in asked_model.counts.items() if s.startswith("work/")) == 3)
        await r.restart()  # mid-work: the three calls run on in the server
        response = await r.finished(asked)

        assert response["status"] == "completed"
        keys = sorted(c.effect_key for c in await r.calls(asked["task_id"]))
        assert keys == ["plan", "summarize", "work/0", "work/1", "work/2"]
        assert dict(asked_model.counts) == {
            "plan": 1,
            "work/Introduce Liu Bei": 1,
            "work/Introduce Guan Yu": 1,
            "work/Introduce Zhang Fei": 1,
            "summarize": 1,
        }
        answer = next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer")
        assert all(name in answer for name in NAMES)


async def test_a_router_restarted_with_other_prompts_reattaches_to_the_calls_it_started(tmp_path: Path) -> None:
    """A Router restarted mid-plan whose prompts now differ (here its settings changed: "2 to 3 tasks"; an upgrade
    that rewords a prompt does the same) re-attaches to the plan call it started, by its key, instead of failing."""
    asked_model = Asked()

    def reply(prompt: str) -> ServerReply:
        step = asked_model.step(prompt)
        return ServerReply(text=demo_answer(prompt), delay=3.0 if step == "plan" else 0.0)

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask(LIU_BEI)
        await eventually(lambda: asked_model.counts["plan"] == 1, what="the plan call started")
        await r.restart(RouterSettings(max_subtasks=3, concurrency=2))
        response = await r.finished(asked)

        assert response["status"] == "completed", response
        assert asked_model.counts["plan"] == 1 and asked_model.counts["summarize"] == 1
        keys = sorted(c.effect_key for c in await r.calls(asked["task_id"]))
        assert keys == ["plan", "summarize", "work/0", "work/1", "work/2"]


async def test_a_restart_after_a_replan_replays_the_same_rounds(tmp_path: Path) -> None:
    asked_model = Asked()
    first_batch = asyncio.Event()

    def reply(prompt: str) -> ServerReply:
        step = asked_model.step(prompt)
        if step == "work/Introduce Liu Bei":
            first_batch.set()
        slow = step.startswith("work/")  # both rounds' work is slow: the kill lands in round 1's
        return ServerReply(text=demo_answer(prompt), delay=1.5 if slow else 0.0)

    async with scripted_model(reply) as model, routed(tmp_path, model=model) as r:
        asked = await r.ask(LIU_BEI)
        await eventually(first_batch.is_set, what="the first work call")
        await r.say(asked["conversation_id"], "Also introduce Cao Cao")
        await eventually(lambda: asked_model.counts["work/Also introduce Cao Cao"] == 1, timeout=30)
        await r.restart()
        response = await r.finished(asked)

        assert response["status"] == "completed"
        keys = sorted(c.effect_key for c in await r.calls(asked["task_id"]))
        assert keys == ["plan", "plan/1", "summarize", "work/0", "work/1", "work/1/0", "work/2"]
        assert asked_model.counts["plan"] == 2
        assert asked_model.counts["work/Also introduce Cao Cao"] == 1
        assert asked_model.counts["summarize"] == 1
        assert len(progress_messages(await r.messages(asked["task_id"]))) == 1
