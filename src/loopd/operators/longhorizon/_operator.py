"""`LongHorizon`: the reconciler that works each Task addressed to ``operator:longhorizon`` as a Run of rounds.

Per Task: its Run (named after the Task, owned by it, so deleting the Task or its conversation deletes the Run and
its children) is created once; then, phase after phase of the pure machine (`_phases`)::

    Receiving ─ follow-ups (bounded) into the guidance, committed with the status ─▶ Planning
    Planning  ─ Manager call <runUID>/round/<n>/manager (no tools) → decision ─▶ Executing | WaitingForHuman | done
    Executing ─ Execution <run>-r<n>; Executor call …/executor (tools write, the Run's workspace) ─▶ Auditing
    Auditing  ─ Audit <run>-r<n>; Auditor call …/auditor (tools read, same workspace) → verdict ─▶ Receiving
    WaitingForHuman ─ Ask / Confirm …/human-<reason>; the answer (the Task is woken) ─▶ Receiving | Stopped

Each step is one keyed harness call (owner = the Run's UID), so a reconcile that runs again — after a requeue, a
crash, a take-over — re-attaches to the same call and never repeats it. Each step's report is then written into the
Task's work conversation (`_reports`: keyed like the call; a report missing its end gets only its end), and only then
the Run's status (guarded by its resource version). At a terminal phase the Run records the answer's message, is
released from the Task (so it outlives it), and the Task completes with the summary as its answer (one request); the
Run is deleted after the retention TTL (`collect`, on the Run watch), its Executions and Audits with it.

A Task whose conversation already has a live Run started earlier is a follow-up: it waits until that Run takes it
as guidance (then it completes, pointing there) or ends (then it starts its own Run).

Must not import: loopd.server, loopd.harness, loopd.cli.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Final

from loopd.operators.longhorizon._auditor import auditor_prompt, parse_verdict
from loopd.operators.longhorizon._errors import ParseError, RunGone, StaleRun
from loopd.operators.longhorizon._executor import executor_prompt
from loopd.operators.longhorizon._manager import manager_prompt, parse_decision
from loopd.operators.longhorizon._phases import (
    TERMINAL,
    Decision,
    Followup,
    HumanOutcome,
    Ref,
    RunState,
    Verdict,
    answered,
    audited,
    decided,
    executed,
    expire,
    receive,
    start,
)
from loopd.operators.longhorizon._reports import Role, report
from loopd.operators.longhorizon._resources import (
    MAX_CONTEXT_MESSAGES,
    MAX_TEXT,
    Audit,
    AuditSpec,
    AuditStatus,
    ContextMessage,
    Execution,
    ExecutionSpec,
    ExecutionStatus,
    ObjectRef,
    Run,
    RunSpec,
    execution_name,
)
from loopd.operators.longhorizon._settings import LongHorizonSettings
from loopd.operators.longhorizon._status import from_status, to_status, wire_verdict
from loopd.operators.longhorizon._store import CONVERSATION_LABEL, RunStore, label_value
from loopd.operators.router import result_text
from loopd.resources import ObjectMeta, ResourceError
from loopd.resources.client import TASKS
from loopd.runtime import (
    Conflict,
    InvalidRequest,
    LeaderElection,
    NotFound,
    Question,
    Result,
    Runtime,
    Task,
    TaskContext,
    TemporaryError,
    ToolsProfile,
)

__all__ = [
    "FAILURE_CODE",
    "LONGHORIZON_DESCRIPTION",
    "LONGHORIZON_DISPLAY_NAME",
    "LONGHORIZON_KEY",
    "LongHorizon",
    "effect_key",
    "human_key",
]

logger = logging.getLogger("loopd.operators.longhorizon")

LONGHORIZON_KEY: Final = "longhorizon"
LONGHORIZON_DISPLAY_NAME: Final = "LongHorizon"
LONGHORIZON_DESCRIPTION: Final = (
    "Works a longer task in rounds: a Manager plans, an Executor works in a workspace with tools, an Auditor checks "
    "the artifacts, until the work is verified done."
)
FAILURE_CODE: Final = "longhorizon_failed"
TASK_API_VERSION: Final = "loopd.dev/v1alpha1"
_WAIT_GRACE: Final = 120.0
"""Seconds past a call's own timeout the operator waits before it gives up on it (the engine times it out first)."""
_START_WAIT: Final = 30.0
"""Seconds the request that starts a call also waits for its end (the server's most)."""
HUMAN_POLL: Final = 30.0
"""Seconds between looks at a pending question (an answer wakes the Task at once anyway)."""
FOLLOWUP_POLL: Final = 2.0
"""Seconds between looks while a follow-up Task waits for the live Run of its conversation."""
_CONTEXT_BYTES: Final = 16_000
_OUTCOMES: Final = {
    "success": HumanOutcome("success"),
    "dismissed": HumanOutcome("dismissed"),
    "timeout": HumanOutcome("timeout"),
}
"""A question's terminal status as the machine's outcome (anything else is a failure)."""


def effect_key(run_uid: str, round_: int, role: Role) -> str:
    """The effect key of ``role``'s call (and report) in round ``round_``: ``<runUID>/round/<n>/<role>``."""
    return f"{run_uid}/round/{round_}/{role}"


def human_key(run_uid: str, round_: int, reason: str) -> str:
    """The effect key of a question to the human: ``<runUID>/round/<n>/human-<reason>``."""
    return f"{run_uid}/round/{round_}/human-{reason}"


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


class LongHorizon:
    """The LongHorizon reconciler: ``await lh.reconcile(task)`` works one Task's Run (see the module docstring).

    ``rt`` is an open runtime acting as ``operator:<key>``; the Run / Execution / Audit resources live in its
    namespace (their CRDs installed: ``rt.ensure_crds(crds())``). `watch` binds the reconciler to the Tasks
    (``concurrency`` workers) and `collect` to the Runs, `register` lists the operator in ``/v1/actors``.
    """

    def __init__(
        self,
        rt: Runtime,
        settings: LongHorizonSettings | None = None,
        *,
        key: str = LONGHORIZON_KEY,
    ) -> None:
        self._rt = rt
        self.settings = settings or LongHorizonSettings()
        self.store = RunStore(rt)
        self.key = key

    async def register(self, *, lease_seconds: float = 30.0) -> None:
        """Register ``operator:<key>`` (renewed in the background by the runtime)."""
        await self._rt.register(
            self.key,
            display_name=LONGHORIZON_DISPLAY_NAME,
            description=LONGHORIZON_DESCRIPTION,
            lease_seconds=lease_seconds,
        )

    def watch(self, *, leader_election: str | LeaderElection | None = None) -> None:
        """Once ``rt.run()`` runs: reconcile the Tasks addressed to ``operator:<key>`` (``concurrency`` workers), and
        the Runs with `collect` (deleted after the retention TTL); both under ``leader_election`` when given."""
        self._rt.task.watch(
            self.key, self, workers=self.settings.concurrency, leader_election=leader_election, kind="operator"
        )
        self._rt.watch(Run, self.collect, workers=1, leader_election=leader_election)

    async def reconcile(self, task: Task) -> Result | None:
        """Work ``task``'s Run as far as it can go now; None when the Task is done, else when to look again."""
        context = await self._rt.task.get(task.id)  # TaskNotReady: the runtime requeues shortly
        if context.response.status != "streaming":
            return None  # answered already (a late requeue)
        work = _RunWork(self._rt, self.settings, self.store, task, context)
        try:
            return await work.go()
        except RunGone as exc:
            logger.info("task %s: its Run is gone (%s); nothing more to do", task.id, exc)
            return None
        except StaleRun as exc:
            raise TemporaryError(f"task {task.id}: {exc}; reading it again", delay=0.2) from exc

    async def collect(self, run: Run) -> Result | None:
        """Delete ``run`` once it has been finished for the retention TTL (with its Executions and Audits); else
        when to look again. A Run that is not finished is left alone (its Task's reconcile drives it)."""
        status = run.status
        if status is None or status.phase not in TERMINAL:
            return None
        finished = _parse_time(status.finished_at) or _parse_time(run.metadata.creation_timestamp)
        if finished is None:
            return None
        due = finished + timedelta(seconds=self.settings.retention_ttl)
        now = self._rt.clock.now()
        if now < due:
            return Result(requeue_after=(due - now).total_seconds())
        with contextlib.suppress(RunGone, StaleRun):  # gone already; or changed: the watch brings it back
            await self.store.delete_run(run)
        logger.info("run %s: deleted after its retention time", run.metadata.name)
        return None


class _RunWork:
    """One reconcile of one Task's Run."""

    def __init__(
        self, rt: Runtime, settings: LongHorizonSettings, store: RunStore, task: Task, context: TaskContext
    ) -> None:
        self._rt = rt
        self._settings = settings
        self._store = store
        self._task = task
        self._context = context
        self._last_call_id: str | None = None
        """The id of the call `_call` started or re-attached to last (for an Execution's or Audit's status)."""

    def _now(self) -> str:
        return _stamp(self._rt.clock.now())

    # -- the loop -------------------------------------------------------------------------------------------------

    async def go(self) -> Result | None:
        found = await self._find_or_create()
        if not isinstance(found, Run):
            return found
        run = found
        state = from_status(run.status)
        if state is None:
            state = start(run.spec.goal, run.spec.max_rounds, run.spec.input_message_id)
            run = await self._write(run, state)
        deadline = _parse_time(run.spec.deadline_at)
        while not state.terminal:
            past = deadline is not None and self._rt.clock.now() >= deadline
            expired = expire(state, now=self._now(), past_deadline=past)
            following = expired if expired is not state else await self._step(run, state)
            if isinstance(following, Result):  # waiting for a person: look again by then, or at the deadline
                if deadline is not None and following.requeue_after is not None:
                    remaining = (deadline - self._rt.clock.now()).total_seconds()
                    return Result(requeue_after=max(0.05, min(following.requeue_after, remaining)))
                return following
            if following != state:
                run = await self._write(run, following)
            state = following
        await self._finish(run, state)
        return None

    async def _write(self, run: Run, state: RunState) -> Run:
        status = to_status(state, previous=run.status, now=self._now())
        return await self._store.write_run_status(run, status)

    async def _step(self, run: Run, state: RunState) -> RunState | Result:
        if state.phase == "Receiving":
            return await self._receive(state)
        if state.phase == "Planning":
            return await self._plan(run, state)
        if state.phase == "Executing":
            return await self._execute(run, state)
        if state.phase == "Auditing":
            return await self._audit(run, state)
        return await self._ask_human(run, state)

    # -- the Run ---------------------------------------------------------------------------------------------------

    async def _find_or_create(self) -> Run | Result | None:
        """The Task's Run; or, for a follow-up of a live Run, None (taken: the Task completed) / a requeue (waiting)."""
        found = await self._store.find_run(self._task.id)
        if found is not None:
            return found
        context = self._context
        siblings = [
            r
            for r in await self._store.list_runs(conversation=context.conversation.id)
            if r.metadata.name != self._task.id
        ]
        for other in siblings:
            taken = other.status.input_message_ids if other.status is not None else None
            if context.input.id in (taken or ()):
                text = (
                    "Your message was taken as guidance by the LongHorizon run already working in this conversation "
                    f"({other.metadata.name}); its answer will follow there."
                )
                await _complete(self._rt, self._task.id, error=None, answer=text)
                return None
        if any(
            (r.status is None or r.status.phase not in TERMINAL) and r.spec.input_message_id < context.input.id
            for r in siblings
        ):
            return Result(requeue_after=FOLLOWUP_POLL)  # the live Run may take this message at its next Receiving
        goal = context.input.text.strip()
        if not goal or len(goal) > MAX_TEXT:
            why = "the question has no text" if not goal else f"the question is longer than {MAX_TEXT} characters"
            await _complete(self._rt, self._task.id, error=(FAILURE_CODE, why))
            return None
        deadline = self._rt.clock.now() + timedelta(seconds=self._settings.run_timeout)
        history = [m for m in context.history if m.id != context.input.id and m.status != "streaming"]
        run = Run(
            metadata=ObjectMeta(name=self._task.id, labels={CONVERSATION_LABEL: label_value(context.conversation.id)}),
            spec=RunSpec(
                conversation=ObjectRef(name=context.conversation.id),
                workspaceID=self._task.id,
                user_key=context.input.key,
                deadline_at=_stamp(deadline),
                inputMessageID=context.input.id,
                goal=goal,
                max_rounds=self._settings.max_rounds,
                context_messages=[
                    ContextMessage(conversationID=m.conversation_id, messageID=m.id)
                    for m in history[-MAX_CONTEXT_MESSAGES:]
                ]
                or None,
            ),
        )
        return await self._store.create_run(run, owner=self._task)

    def _history_text(self, run: Run) -> str:
        wanted = {c.message_id for c in run.spec.context_messages or ()}
        lines = [f"{m.kind}/{m.key}: {m.text.strip()}" for m in self._context.history if m.id in wanted]
        text = "\n".join(lines)
        while len(text.encode("utf-8")) > _CONTEXT_BYTES and "\n" in text:
            text = text.split("\n", 1)[1]  # the oldest lines give way
        return text[-_CONTEXT_BYTES:]

    # -- steps -----------------------------------------------------------------------------------------------------

    async def _receive(self, state: RunState) -> RunState:
        page = await self._rt.task.followups(self._task.id, after=state.consumed_through, limit=100)
        followups = [Followup(m.id, m.text) for m in page if m.id not in state.input_message_ids]
        return receive(state, followups, now=self._now())

    async def _plan(self, run: Run, state: RunState) -> RunState:
        key = effect_key(str(run.metadata.uid), state.round, "manager")
        prompt = manager_prompt(state, goal=run.spec.goal, context=self._history_text(run))
        said = await self._call(run, key, prompt, role="manager", tools="none")
        decision: Decision | str
        if isinstance(said, _Failure):
            decision = said.reason
            text = f"The Manager's call failed: {said.reason}"
        else:
            try:
                decision = parse_decision(said)
            except ParseError as exc:
                decision = f"Invalid decision: {exc}"
                text = f"The Manager's answer is not a valid decision: {exc}\n\n{exc.answer[:2000]}"
            else:
                text = _decision_text(decision)
        message_id = await self._report(run, key, "manager", state.round, text)
        return decided(
            state,
            decision,
            now=self._now(),
            message_id=message_id,
            execution=execution_name(str(run.metadata.name), state.round),
        )

    async def _execute(self, run: Run, state: RunState) -> RunState:
        plan = state.decision.plan if state.decision is not None else ""
        name = execution_name(str(run.metadata.name), state.round)
        execution = await self._store.ensure_execution(
            Execution(
                metadata=ObjectMeta(name=name),
                spec=ExecutionSpec(
                    run=str(run.metadata.name),
                    round=state.round,
                    contract_version=state.contract_version,
                    contract=state.contract,
                    plan=plan or "(none)",
                ),
            ),
            run,
        )
        key = effect_key(str(run.metadata.uid), state.round, "executor")
        said = await self._call(run, key, executor_prompt(state, plan=plan), role="executor", tools="write")
        failed = isinstance(said, _Failure)
        text = f"The Executor's call failed: {said.reason}" if isinstance(said, _Failure) else said
        message_id = await self._report(run, key, "executor", state.round, text)
        if execution.status is None or execution.status.phase in (None, "Running"):
            execution = await self._store.write_execution_status(
                execution,
                ExecutionStatus(
                    phase="Failed" if failed else "Completed",
                    callID=self._last_call_id,
                    messageID=message_id,
                    error=said.reason if isinstance(said, _Failure) else None,
                ),
            )
        if isinstance(said, _Failure):
            return executed(state, said.reason, message_id=message_id)
        return executed(state, Ref(name, str(execution.metadata.uid)), message_id=message_id)

    async def _audit(self, run: Run, state: RunState) -> RunState:
        current = state.execution
        name = current.name if current is not None else execution_name(str(run.metadata.name), state.round)
        execution = await self._store.get_execution(name)
        report_text = ""
        if execution.status is not None and execution.status.call_id:
            call = await self._rt.harness.get(execution.status.call_id)
            report_text = result_text(call.state.result) or call.state.text
        audit = await self._store.ensure_audit(
            Audit(
                metadata=ObjectMeta(name=name),
                spec=AuditSpec(
                    run=str(run.metadata.name),
                    round=state.round,
                    contract_version=state.contract_version,
                    contract=state.contract,
                    execution=ObjectRef(name=name, uid=str(execution.metadata.uid)),
                    executionMessageID=(execution.status.message_id if execution.status else None) or "",
                ),
            ),
            run,
        )
        plan = execution.spec.plan
        key = effect_key(str(run.metadata.uid), state.round, "auditor")
        prompt = auditor_prompt(state, plan=plan, report=report_text)
        said = await self._call(run, key, prompt, role="auditor", tools="read")
        outcome: Verdict | str
        if isinstance(said, _Failure):
            outcome = said.reason
            text = f"The Auditor's call failed: {said.reason}"
        else:
            try:
                outcome = parse_verdict(said)
            except ParseError as exc:
                outcome = f"invalid verdict: {exc}"
                text = f"The Auditor's answer is not a valid verdict: {exc}\n\n{exc.answer[:2000]}"
            else:
                text = _verdict_text(outcome)
        message_id = await self._report(run, key, "auditor", state.round, text)
        if audit.status is None or audit.status.phase in (None, "Running"):
            audit = await self._store.write_audit_status(
                audit,
                AuditStatus(
                    phase="Completed" if isinstance(outcome, Verdict) else "Failed",
                    callID=self._last_call_id,
                    messageID=message_id,
                    error=outcome if isinstance(outcome, str) else None,
                    verdict=wire_verdict(outcome) if isinstance(outcome, Verdict) else None,
                ),
            )
        audited_execution = Ref(audit.spec.execution.name, audit.spec.execution.uid)
        return audited(
            state,
            outcome,
            audit=Ref(str(audit.metadata.name), str(audit.metadata.uid)),
            execution=audited_execution,
            message_id=message_id,
            contract_version=audit.spec.contract_version,
        )

    async def _ask_human(self, run: Run, state: RunState) -> RunState | Result:
        reason = state.human_reason or "ask"
        key = human_key(str(run.metadata.uid), state.round, reason)
        question = await self._question(key, reason, state)
        if state.human_message_id != question.message_id:
            return replace(state, human_message_id=question.message_id)  # recorded first, then waited on
        asked = question.state
        if not asked.terminal:
            await self._say_waiting(asked.title)
            return Result(requeue_after=HUMAN_POLL)  # an answer bumps the Task's revision: it is reconciled at once
        value = asked.value if isinstance(asked.value, str) else ("" if asked.value is None else str(asked.value))
        outcome = _OUTCOMES.get(asked.status, HumanOutcome("failure"))
        prompt = state.decision.question if state.decision is not None else ""
        return answered(state, replace(outcome, value=value, text=value), now=self._now(), question=prompt)

    async def _say_waiting(self, title: str) -> None:
        """The Task's status says it waits for a person (``WaitingInput``; the runtime writes ``Running`` again when
        the answer wakes it). Best effort: a failed write is logged."""
        status = {"phase": "WaitingInput", "message": f"waiting for the user: {title}"[:200]}
        try:
            client = await self._rt.resource_client()
            await client.patch(
                TASKS, self._task.id, {"status": status}, namespace=self._task.namespace or None, subresource="status"
            )
        except ResourceError as exc:
            logger.info("task %s: could not say it waits for the user: %s", self._task.id, exc)

    async def _question(self, key: str, reason: str, state: RunState) -> Question:
        timeout = self._settings.human_timeout
        if reason == "ask":
            decision = state.decision
            question = decision.question if decision is not None else "How should the work go on?"
            choices = [(c.value, c.label) for c in decision.choices] if decision is not None else []
            allow_other = (decision.allow_other if decision is not None else True) or not choices
            return await self._rt.human.ask(
                self._task.id,
                key,
                title="The Manager asks",
                prompt=question,
                timeout=timeout,
                choices=choices,
                allow_other=allow_other,
            )
        if reason == "budget":
            prompt = (
                f"The run has used its budget of {state.budget} rounds without finishing. Continue with 25 more "
                "rounds (the deadline stays the same), or finish here?"
            )
        else:
            recent = "; ".join(r.summary for r in state.rounds[-3:])
            prompt = f"The last {state.failures} rounds failed ({recent}). Continue, or finish here?"
        return await self._rt.human.confirm(
            self._task.id,
            key,
            title="Continue the run?",
            prompt=prompt[:4000],
            timeout=timeout,
            confirm_label="Continue",
            decline_label="Finish here",
        )

    async def _finish(self, run: Run, state: RunState) -> None:
        if state.final_message_id is None:
            state = replace(state, final_message_id=self._context.response.id)
            run = await self._write(run, state)
        await self._store.release_run(run)
        error = (FAILURE_CODE, state.summary) if state.phase == "Failed" else None
        await _complete(self._rt, self._task.id, error=error, answer=_final_text(state))

    # -- calls and reports -----------------------------------------------------------------------------------------

    async def _call(self, run: Run, key: str, prompt: str, *, role: Role, tools: ToolsProfile) -> str | _Failure:
        """Start (or re-attach to) ``role``'s call and wait for its text; a `_Failure` for any permanent problem."""
        timeout = self._settings.timeout_of(role)
        workspace = None if tools == "none" else f"{self._settings.workspace}/{run.metadata.uid}"
        try:
            call = await self._rt.harness.prompt(
                str(run.metadata.uid),
                key,
                self._settings.target,
                prompt,
                task_id=self._task.id,
                timeout=timeout,
                output="work",
                workspace=workspace,
                tools=tools,
                wait=_START_WAIT,  # start and wait in one request; a longer call is waited on below
            )
        except Conflict as exc:
            return _Failure(f"the {role}'s call exists with other parameters ({exc.message})")
        except InvalidRequest as exc:
            return _Failure(f"the {role}'s call was refused: {exc.message}")
        self._last_call_id = call.id
        try:
            done = await call.wait(timeout=timeout + _WAIT_GRACE)
        except TimeoutError:
            return _Failure(f"the {role}'s call did not finish in {timeout:g} s")
        if done.phase != "succeeded":
            error = done.error or {}
            detail = str(error.get("message") or error.get("code") or "no reason given")
            return _Failure(f"the {role}'s call {done.phase.replace('_', ' ')}: {detail}")
        text = result_text(done.result) or done.text
        if not text.strip():
            return _Failure(f"the {role}'s call returned nothing")
        return text

    async def _report(self, run: Run, key: str, role: Role, round_: int, text: str) -> str:
        return await report(
            self._rt, self._task.id, key, role=role, round_=round_, run=str(run.metadata.name), text=text
        )


class _Failure:
    """A step's permanent failure (the round fails; the Run goes on)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


async def _complete(rt: Runtime, task_id: str, *, error: tuple[str, str] | None, answer: str | None = None) -> None:
    """Complete the Task (with its answer, in the same request); completed already or gone is fine."""
    try:
        await rt.chat.complete(task_id, error=error, answer=answer)
    except (Conflict, NotFound) as exc:
        logger.info("task %s: completion refused (%s); it is being completed already", task_id, exc.message)


def _decision_text(decision: Decision) -> str:
    lines = [f"Decision: {decision.next}."]
    if decision.summary:
        lines.append(decision.summary)
    if decision.contract:
        lines += ["", "Contract:", decision.contract]
    if decision.plan:
        lines += ["", "Plan:", decision.plan]
    if decision.question:
        lines += ["", "Question:", decision.question]
    return "\n".join(lines)


def _verdict_text(verdict: Verdict) -> str:
    lines = [
        f"Verdict: {'complete' if verdict.complete else 'incomplete'}, integrity {verdict.integrity}.",
    ]
    if verdict.task_state:
        lines += ["", "Task state:", verdict.task_state]
    if verdict.evidence:
        lines += ["", "Evidence:", verdict.evidence]
    if verdict.feedback:
        lines += ["", "Feedback:", verdict.feedback]
    return "\n".join(lines)


def _final_text(state: RunState) -> str:
    """The Task's answer at the end: "Done in round N: …" for a success; a stop or failure's summary says it all."""
    if state.phase != "Succeeded":
        return state.summary
    lines = [f"Done in round {state.round}: {state.summary}".strip()]
    if state.task_state and state.task_state not in state.summary:
        lines += ["", state.task_state]
    return "\n".join(lines)
