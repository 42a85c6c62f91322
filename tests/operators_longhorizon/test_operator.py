"""The LongHorizon operator against a real loop-server (in process, loopback) and its embedded Kubernetes API.

Scenario rules (`scenarios`) bend the demo model's scripted path by a marker in the goal, so one server runs several
Runs at once. Durations that must pass (a human timeout, a Run deadline, the retention TTL) are seconds long; every
wait is for a condition with a deadline, never a timed assertion.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from loopd.operators.longhorizon import LongHorizonSettings, RunGone, RunStore, StaleRun
from loopd.operators.longhorizon._resources import RunStatus
from loopd.resources.client import TASKS
from loopd.runtime import Runtime
from loopd.server._composition import default_workspaces
from tests.operators_longhorizon.rig import HELLO, Rig, Served, attached, served
from tests.operators_longhorizon.scenarios import QUESTION, reports, scenario_rules
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def on(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """One loop-server for the module (its demo model taught the scenario rules); each test attaches its operator."""
    async with served(tmp_path_factory.mktemp("longhorizon"), rules=scenario_rules()) as server:
        yield server


def answer_of(response: dict[str, Any]) -> str:
    return str(next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer"))


async def status_of(r: Rig, task_id: str) -> RunStatus:
    run = await r.run(task_id)
    assert run is not None and run.status is not None
    return run.status


async def test_the_demo_run_writes_hello_txt_audits_it_and_succeeds(on: Served) -> None:
    """Planning → Executing → Auditing → Succeeded, hello.txt really written by the Executor's tool call and really
    read by the Auditor."""
    async with attached(on) as r:
        asked = await r.ask(HELLO)
        task_id = asked["task_id"]
        response = await r.finished(asked)

        assert response["status"] == "completed", response
        answer = next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer")
        assert answer.startswith("Done in round 2: hello.txt contains") and "hello.txt" in answer

        run = await r.run(task_id)
        assert run is not None and run.status is not None
        assert run.status.phase == "Succeeded" and run.status.round == 2 and run.status.contract_version == 1
        assert not run.metadata.owner_references  # released from its Task: kept for the retention time
        last = run.status.last_audit
        assert last is not None and last.verdict.complete and last.verdict.integrity == "clean"
        assert "hello world" in last.verdict.evidence

        uid = str(run.metadata.uid)
        calls = await r.calls(uid)
        assert sorted(c.effect_key for c in calls) == [
            f"{uid}/round/1/auditor",
            f"{uid}/round/1/executor",
            f"{uid}/round/1/manager",
            f"{uid}/round/2/manager",
        ]
        assert all(c.phase == "succeeded" for c in calls)
        workspace = default_workspaces(on.server.data_dir) / "operator" / "longhorizon" / "runs" / uid
        assert (workspace / "hello.txt").read_text() == "hello world\n"  # really written by the Executor's tool

        reports = [m for m in await r.messages(task_id) if m.content.get("biz") == "loopd.longhorizon"]
        authors = [m.content["meta"]["author"] for m in reports]
        assert authors == [
            "operator/longhorizon/manager",
            "operator/longhorizon/executor",
            "operator/longhorizon/auditor",
            "operator/longhorizon/manager",
        ]
        assert all(m.status == "completed" for m in reports)
        assert {m.conversation_id for m in reports} != {asked["conversation_id"]}
        [execution] = await r.executions(task_id)
        [audit] = await r.audits(task_id)
        assert execution.status is not None and execution.status.phase == "Completed"
        assert audit.status is not None and audit.status.verdict is not None and audit.status.verdict.complete


async def test_three_role_correction_and_a_stale_audit_never_produce_done(on: Served) -> None:
    async with attached(on) as r:
        asked = await r.ask(f"{HELLO} [wrong-once] [early-done] [new-contract]")
        response = await r.finished(asked, timeout=90)

        assert response["status"] == "completed", response
        status = await status_of(r, asked["task_id"])
        assert status.phase == "Succeeded" and status.round == 6 and status.contract_version == 2
        assert status.failures == 0
        rounds = {record.index: record for record in status.rounds or ()}
        assert rounds[1].summary.startswith("Audit: incomplete")  # the audit found the wrong content
        assert rounds[2].summary == "Completion rejected: the last audit found the work incomplete."
        assert rounds[3].summary.startswith("Audit: complete, integrity clean")
        assert rounds[4].summary == "Completion rejected: the last audit checked contract version 1, not 2."
        assert rounds[5].summary.startswith("Audit: complete")  # the new contract audited afresh
        assert rounds[6].decision == "done"
        assert status.last_audit is not None and status.last_audit.contract_version == 2
        assert status.last_audit.execution.name.endswith("-r5")
        assert sorted(e.spec.round for e in await r.executions(asked["task_id"])) == [1, 3, 5]
        assert sorted((a.spec.round, a.spec.contract_version) for a in await r.audits(asked["task_id"])) == [
            (1, 1),
            (3, 1),
            (5, 2),
        ]
        assert reports(await r.messages(asked["task_id"])) == [
            ("manager", 1), ("executor", 1), ("auditor", 1),
            ("manager", 2),
            ("manager", 3), ("executor", 3), ("auditor", 3),
            ("manager", 4),
            ("manager", 5), ("executor", 5), ("auditor", 5),
            ("manager", 6),
        ]  # fmt: skip


async def test_human_answers_and_fallbacks(on: Served) -> None:
    settings = LongHorizonSettings(concurrency=4, human_timeout=10)  # room to answer on a loaded machine
    async with attached(on, settings=settings) as r:
        answered = await r.ask(f"{HELLO} [ask]")
        dismissed = await r.ask(f"{HELLO} [ask] (dismiss)")
        ignored = await r.ask(f"{HELLO} [ask] (ignore)")
        junk = await r.ask(f"{HELLO} [junk]")

        await r.reply(answered, "success", "hi")
        await r.reply(dismissed, "dismissed")
        await r.reply(junk, "success", "declined")  # three invalid decisions: "Continue?" → Finish here

        done = await r.finished(answered, timeout=60)
        assert done["status"] == "completed" and answer_of(done).startswith("Done in round 3")
        status = await status_of(r, answered["task_id"])
        assert status.guidance == f"Question: {QUESTION}\nAnswer: hi"
        assert [(x.index, x.decision) for x in status.rounds or ()][:1] == [(1, "ask")]

        stopped = await r.finished(dismissed)
        assert stopped["status"] == "completed"
        assert answer_of(stopped) == "Stopped in round 1: the question to you was dismissed."
        timed_out = await r.finished(ignored, timeout=60)
        assert "the question to you timed out" in answer_of(timed_out)
        assert (await status_of(r, ignored["task_id"])).phase == "Stopped"

        failed = await r.finished(junk)
        assert "3 failures in a row and you chose to finish" in answer_of(failed)
        junk_status = await status_of(r, junk["task_id"])
        assert junk_status.phase == "Stopped" and junk_status.failures == 3
        assert all(x.summary.startswith("Invalid decision: the decision is not JSON") for x in junk_status.rounds or ())
        assert junk_status.human_reason is None and not any(
            c.type == "WaitingForHuman" and c.status == "True" for c in junk_status.conditions or ()
        )


async def test_past_the_budget_the_user_stops_or_continues_with_25_more_rounds(on: Served) -> None:
    async with attached(on, settings=LongHorizonSettings(max_rounds=1)) as r:
        declined = await r.ask(f"{HELLO} [wrong-always]")
        accepted = await r.ask(f"{HELLO} [wrong-once]")

        await r.reply(declined, "success", "declined")
        await r.reply(accepted, "success", "accepted")

        stopped = await r.finished(declined, timeout=60)
        assert "the round budget is spent and you chose to finish" in answer_of(stopped)
        assert (await status_of(r, declined["task_id"])).budget == 1
        done = await r.finished(accepted, timeout=60)
        assert answer_of(done).startswith("Done in round 3")
        status = await status_of(r, accepted["task_id"])
        assert status.budget == 26 and status.phase == "Succeeded"
        run = await r.run(accepted["task_id"])
        assert run is not None and run.spec.deadline_at is not None  # the deadline is the spec's: never extended


async def test_the_deadline_fails_the_run_and_the_retention_ttl_deletes_it_with_its_children(on: Served) -> None:
    settings = LongHorizonSettings(run_timeout=12, retention_ttl=1, human_timeout=600)
    async with attached(on, settings=settings) as r:
        asked = await r.ask(f"{HELLO} [ask-r2]")  # round 1 works, round 2 asks and nobody answers
        await r.pending_question(asked["task_id"])
        assert [e.spec.round for e in await r.executions(asked["task_id"])] == [1]

        response = await r.finished(asked, timeout=60)

        assert response["status"] == "failed"
        assert "Deadline exceeded in round 2 (WaitingForHuman)" in answer_of(response)
        assert "longhorizon_failed" in json.dumps(response["content"])
        await eventually(lambda: _gone(r, asked["task_id"]), timeout=30, what="the Run to be deleted")
        assert (
            await r.executions(asked["task_id"]) == [] and await r.audits(asked["task_id"]) == []
        )  # garbage-collected with it


async def _gone(r: Rig, name: str) -> bool:
    return await r.run(name) is None


class FlakyEnds(httpx.AsyncBaseTransport):
    """Fails the first ``failures`` requests that end an output (as if the server could not be reached)."""

    def __init__(self, failures: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.left = failures

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/end") and self.left > 0:
            self.left -= 1
            raise httpx.ConnectError("injected: the output's end did not reach the server", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class CheckedStore(RunStore):
    """Checks, at every status write that records a report, that the report has ended (the end comes first)."""

    def __init__(self, rt: Runtime, task_ids: list[str], problems: list[str]) -> None:
        super().__init__(rt)
        self._rt = rt
        self._task_ids = task_ids
        self._problems = problems

    async def write_run_status(self, run: Any, status: RunStatus) -> Any:
        ids = {i for record in status.rounds or () for i in record.messages or ()}
        ids |= {status.manager_message_id} - {None}  # type: ignore[arg-type]
        if ids and self._task_ids:
            messages = {m.id: m for m in await self._rt.task.messages(self._task_ids[0], limit=100)}
            self._problems += [
                f"{i} is {messages[i].status}" for i in ids if i in messages and messages[i].status != "completed"
            ]
        return await super().write_run_status(run, status)


async def test_a_report_whose_end_keeps_failing_is_retried_until_it_lands(on: Served) -> None:
    flaky = FlakyEnds(failures=9)  # three requests of three tries each: the step's reconcile fails three times
    task_ids: list[str] = []
    problems: list[str] = []
    async with attached(
        on,
        transport=flaky,
        store=lambda rt: CheckedStore(rt, task_ids, problems),
    ) as r:
        asked = await r.ask(HELLO)
        task_ids.append(asked["task_id"])
        response = await r.finished(asked, timeout=90)

        assert response["status"] == "completed" and flaky.left == 0
        assert reports(await r.messages(asked["task_id"])) == [
            ("manager", 1), ("executor", 1), ("auditor", 1), ("manager", 2),
        ]  # fmt: skip
        assert problems == []  # no status named a report that had not ended


class HangingStore(RunStore):
    """Holds the first status write into ``phase`` at ``round_`` until ``killed`` is set, then fails it: the operator
    dies there (set just before the kill, so the runtime's drain does not wait for this reconcile)."""

    def __init__(self, rt: Runtime, phase: str, round_: int, reached: asyncio.Event, killed: asyncio.Event) -> None:
        super().__init__(rt)
        self._at = (phase, round_)
        self._reached = reached
        self._killed = killed

    async def write_run_status(self, run: Any, status: RunStatus) -> Any:
        if (status.phase, status.round) == self._at:
            self._reached.set()
            await self._killed.wait()
            raise StaleRun("injected: the operator died before this status write")
        return await super().write_run_status(run, status)


@pytest.mark.parametrize(
    ("phase", "round_", "was"),
    [
        ("Planning", 1, "Receiving"),  # nothing started yet
        ("Executing", 1, "Planning"),  # the Manager's call and report done
        ("Auditing", 1, "Executing"),  # the Executor's call, report and Execution status done
        ("Receiving", 2, "Auditing"),  # the Auditor's call, report and verdict done
        ("Succeeded", 2, "Planning"),  # the final Manager's call and report done
    ],
)
async def test_a_restart_in_any_phase_rewrites_the_status_without_repeating_a_report_or_a_call(
    on: Served, phase: str, round_: int, was: str
) -> None:
    reached, killed = asyncio.Event(), asyncio.Event()
    async with attached(on, store=lambda rt: HangingStore(rt, phase, round_, reached, killed)) as r:
        asked = await r.ask(HELLO)
        await asyncio.wait_for(reached.wait(), timeout=45)  # the step's effects happened; its status not written
        assert (await status_of(r, asked["task_id"])).phase == was

        killed.set()
        await r.restart()
        response = await r.finished(asked, timeout=60)

        assert response["status"] == "completed" and answer_of(response).startswith("Done in round 2")
        assert Counter(reports(await r.messages(asked["task_id"]))) == Counter(
            {("manager", 1): 1, ("executor", 1): 1, ("auditor", 1): 1, ("manager", 2): 1}
        )
        run = await r.run(asked["task_id"])
        assert run is not None
        keys = Counter(c.effect_key.split("/round/")[1] for c in await r.calls(str(run.metadata.uid)))
        assert keys == Counter({"1/manager": 1, "1/executor": 1, "1/auditor": 1, "2/manager": 1})


class CheckpointStore(RunStore):
    """Holds the write into Auditing until ``posted`` is set, and fails the first write that commits follow-ups."""

    def __init__(self, rt: Runtime, posted: asyncio.Event, failed: list[str]) -> None:
        super().__init__(rt)
        self._posted = posted
        self._failed = failed

    async def write_run_status(self, run: Any, status: RunStatus) -> Any:
        if status.phase == "Auditing":
            await self._posted.wait()
        if status.input_through and not self._failed:
            self._failed.append(status.input_through)
            raise StaleRun("injected: the commit of the follow-ups failed")
        return await super().write_run_status(run, status)


async def test_followups_are_checkpointed_once_even_when_their_commit_fails(on: Served) -> None:
    posted = asyncio.Event()
    failed: list[str] = []
    async with attached(on, store=lambda rt: CheckpointStore(rt, posted, failed)) as r:
        asked = await r.ask(HELLO)
        await eventually(lambda: _in_phase(r, asked["task_id"], "Executing"), what="the Run to execute")
        followup = await r.ask("Also say it politely.", conversation=asked["conversation_id"])
        posted.set()

        response = await r.finished(asked, timeout=60)
        taken = await r.finished(followup)

        assert response["status"] == "completed"
        status = await status_of(r, asked["task_id"])
        assert failed == [followup["input"]["id"]]  # the first commit failed …
        assert status.input_message_ids == [asked["input"]["id"], followup["input"]["id"]]  # … taken once
        assert status.guidance == "Follow-up from the user: Also say it politely."
        assert status.round == 3  # the follow-up voided round 1's audit: round 2 worked again, round 3 is done
        assert "taken as guidance by the LongHorizon run" in answer_of(taken)
        assert await r.run(followup["task_id"]) is None  # no Run of its own


async def _in_phase(r: Rig, name: str, phase: str) -> bool:
    run = await r.run(name)
    return run is not None and run.status is not None and run.status.phase == phase


async def test_a_task_deleted_mid_run_takes_its_run_along_and_the_operator_stops(on: Served) -> None:
    reached, release = asyncio.Event(), asyncio.Event()
    stopped: list[str] = []
    async with attached(on, store=lambda rt: GatedStore(rt, reached, release, stopped)) as r:
        asked = await r.ask(HELLO)
        await asyncio.wait_for(reached.wait(), timeout=45)  # the Manager decided; Executing not written yet
        run = await r.run(asked["task_id"])
        assert run is not None

        client = await r.rt.resource_client()
        await client.delete(TASKS, asked["task_id"], namespace="default")  # as when its conversation goes
        await eventually(lambda: _gone(r, asked["task_id"]), what="the Run to be garbage-collected")
        release.set()

        await eventually(lambda: _true(bool(stopped)), what="the operator to find the Run gone")
        keys = [c.effect_key.split("/round/")[1] for c in await r.calls(str(run.metadata.uid))]
        assert keys == ["1/manager"]  # nothing started after the Run went away
        assert stopped == ["gone"]


async def _true(value: bool) -> bool:
    return value


class GatedStore(RunStore):
    """Holds the first write into Executing until ``release`` is set; notes when a write finds the Run gone."""

    def __init__(self, rt: Runtime, reached: asyncio.Event, release: asyncio.Event, stopped: list[str]) -> None:
        super().__init__(rt)
        self._reached = reached
        self._release = release
        self._stopped = stopped

    async def write_run_status(self, run: Any, status: RunStatus) -> Any:
        if status.phase == "Executing":
            self._reached.set()
            await self._release.wait()
        try:
            return await super().write_run_status(run, status)
        except RunGone:
            self._stopped.append("gone")
            raise


async def test_a_restart_while_a_question_waits_finds_the_same_question(on: Served) -> None:
    async with attached(on) as r:
        asked = await r.ask(f"{HELLO} [ask]")
        question = await r.pending_question(asked["task_id"])
        client = await r.rt.resource_client()

        async def waiting_input() -> bool:
            task = await client.get(TASKS, asked["task_id"], namespace="default")
            return bool(task.get("status", {}).get("phase") == "WaitingInput")

        await eventually(waiting_input, what="the Task's status to say it waits for the user")

        await r.restart()
        await r.reply(asked, "success", "hello")
        response = await r.finished(asked, timeout=60)

        assert response["status"] == "completed"
        questions = [m for m in await r.messages(asked["task_id"]) if m.purpose == "human_request"]
        assert [m.id for m in questions] == [question.id]  # asked once, found again by its effect key
        status = await status_of(r, asked["task_id"])
        assert status.guidance == f"Question: {QUESTION}\nAnswer: hello"
