"""`Router`: the reconciler that answers each Task addressed to ``operator:router``, through ``loopd.runtime`` only.

One reconcile works one Task to its end (the watch's ``workers`` bound how many run at once)::

    plan ─▶ work/0 … work/n-1 (all started, then awaited together) ─▶ follow-ups? ─┬─ no ─▶ summarize ─▶ answer
                                                                                  └─ yes: progress/<r>, plan/<r>,
                                                                                     work/<r>/<i>, … (round r)

Every harness call is ``rt.harness.prompt(task.uid, effect_key, target, prompt, output="work")``: its identity is
the Task's UID and the effect key, and its prompt is a function of stored facts only (the question, the history
before it, the follow-ups, the results of finished calls), so running the reconcile again — after a requeue, a
restart or a take-over by another replica — re-attaches to the same calls and starts none twice. The round
boundaries are durable too: the ``progress/<r>`` message spoken before round ``r`` records the follow-ups it
covers, and a restarted Router replays exactly those rounds (`recover_rounds`).

Failures: a `TaskFailed` (an invalid plan, a failed, cancelled, timed-out or empty call, a call whose parameters
changed) cancels the calls this reconcile started that still run, then completes the Task with ``router_failed``
and the message. A retryable runtime error (``Unavailable``, ``CapacityFull``) or a cancellation leaves the calls
running and propagates: the runtime requeues the Task, and the next reconcile re-attaches.

Must not import: loopd.server, loopd.harness, loopd.cli.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from loopd.operators.router._errors import PlanError, TaskFailed
from loopd.operators.router._plans import Plan, parse_plan
from loopd.operators.router._progress import ProgressMark, progress_content, progress_key, recover_rounds
from loopd.operators.router._prompts import (
    Evidence,
    history_text,
    plan_prompt,
    replan_prompt,
    summarize_prompt,
    work_prompt,
)
from loopd.operators.router._settings import RouterSettings
from loopd.operators.router._texts import result_text
from loopd.runtime import (
    MAX_WAIT,
    Call,
    CallState,
    Conflict,
    InvalidRequest,
    LeaderElection,
    Message,
    NotFound,
    Result,
    Runtime,
    RuntimeApiError,
    Task,
    TaskContext,
    TaskNotReady,
)

__all__ = [
    "FAILURE_CODE",
    "FOLLOWUP_ANSWER",
    "MAX_ROUNDS",
    "ROUTER_DESCRIPTION",
    "ROUTER_DISPLAY_NAME",
    "ROUTER_KEY",
    "SUMMARIZE_KEY",
    "Router",
    "plan_key",
    "work_key",
]

logger = logging.getLogger("loopd.operators.router")

ROUTER_KEY: Final = "router"
ROUTER_DISPLAY_NAME: Final = "Router"
ROUTER_DESCRIPTION: Final = (
    "Plans a question, works its parts in parallel with the assistant harness, and writes one answer."
)
FAILURE_CODE: Final = "router_failed"
MAX_ROUNDS: Final = 8
"""Rounds of follow-ups one Task replans for; later follow-ups are left to their own Tasks."""
PAGE: Final = 100
_CANCEL_WAIT: Final = 30.0
"""Seconds the Router waits for a cancelled call to stop before it completes the failed Task anyway."""
_WAIT_GRACE: Final = 120.0
"""Seconds past a call's own timeout the Router waits before it gives up on it (the engine times it out first)."""
FOLLOWUP_ANSWER: Final = "Added to the answer in progress."
"""The answer of a Task whose question an earlier Task of the Router took as a follow-up (its answer covers it)."""
_FOLLOWUP_POLL: Final = 2.0
"""Seconds between two looks, while an earlier answer in the conversation is still being written, at whether it
took this Task's question as a follow-up."""


def plan_key(round_: int) -> str:
    """The effect key of round ``round_``'s planner call: ``plan``, then ``plan/<round>``."""
    return "plan" if round_ == 0 else f"plan/{round_}"


def work_key(round_: int, index: int) -> str:
    """The effect key of task ``index`` (from 0) of round ``round_``: ``work/<i>``, then ``work/<round>/<i>``."""
    return f"work/{index}" if round_ == 0 else f"work/{round_}/{index}"


SUMMARIZE_KEY: Final = "summarize"


class Router:
    """The Router's reconciler: ``await router.reconcile(task)`` answers one Task (see the module docstring).

    ``rt`` is an open runtime acting as ``operator:<key>``; `watch` binds the router to it with ``settings``'
    concurrency, `register` lists it in ``/v1/actors``.
    """

    def __init__(self, rt: Runtime, settings: RouterSettings | None = None, *, key: str = ROUTER_KEY) -> None:
        self._rt = rt
        self.settings = settings or RouterSettings()
        self.key = key

    async def register(self, *, lease_seconds: float = 30.0) -> None:
        """Register ``operator:<key>`` (renewed in the background by the runtime)."""
        await self._rt.register(
            self.key, display_name=ROUTER_DISPLAY_NAME, description=ROUTER_DESCRIPTION, lease_seconds=lease_seconds
        )

    def watch(self, *, leader_election: str | LeaderElection | None = None) -> None:
        """Reconcile the Tasks addressed to ``operator:<key>`` once ``rt.run()`` runs (``concurrency`` workers)."""
        self._rt.task.watch(
            self.key, self, workers=self.settings.concurrency, leader_election=leader_election, kind="operator"
        )

    async def reconcile(self, task: Task) -> Result | None:
        """Answer ``task`` and complete it (``router_failed`` on a permanent failure). Idempotent."""
        # With the Task's own first messages: an earlier run's round marks, without a second request.
        context = await self._rt.task.get(task.id, messages=PAGE)  # TaskNotReady: the runtime requeues shortly
        if context.response.status != "streaming":
            return None  # answered already (a late requeue)
        earlier = await self._earlier_answer(context)
        if earlier == "took":
            await _finish(self._rt, task.id, error=None, answer=FOLLOWUP_ANSWER)
            return None
        if earlier == "working":
            return Result(requeue_after=_FOLLOWUP_POLL)
        work = _TaskWork(self._rt, self.settings, self.key, task, context)
        try:
            answer = await work.answer()
        except TaskFailed as exc:
            await work.cancel_running()
            logger.info("task %s failed: %s", task.id, exc)
            await _finish(self._rt, task.id, error=(FAILURE_CODE, str(exc)))
            return None
        except TaskNotReady:
            raise
        except NotFound:
            logger.info("task %s is gone; nothing to answer", task.id)
            return None
        except Conflict as exc:  # a progress message refused: the Task's completion has begun
            logger.info("task %s is being completed already: %s", task.id, exc.message)
            return None
        await _finish(self._rt, task.id, error=None, answer=answer)  # the answer and the end in one transaction
        return None

    async def _earlier_answer(self, context: TaskContext) -> str:
        """Whether an earlier Task of this Router in the conversation took this question as a follow-up
        (``took``: its answer covers it), may still take it (``working``: its answer is still being written), or
        neither (``free``). A question sent while the Router works is a follow-up of that work (its next round
        replans for it), so it is answered there, not a second time on its own. Looked at: the earlier answers
        still streaming, and the latest earlier one (it may have ended since it took this question)."""
        earlier = [
            m
            for m in context.history
            if m.kind == "operator"
            and m.key == self.key
            and m.purpose == "response"
            and m.task_id is not None
            and m.task_id != context.task_id
            and m.id < context.input.id
        ]
        if not earlier:
            return "free"
        working = [m for m in earlier if m.status == "streaming"]
        candidates = {m.task_id: m for m in (*working, earlier[-1]) if m.task_id is not None}
        for task_id in candidates:
            if await self._took(task_id, context.input.id):
                return "took"
        return "working" if working else "free"

    async def _took(self, task_id: str, input_id: str) -> bool:
        """Whether Task ``task_id``'s recorded rounds (its progress messages) cover the message ``input_id``."""
        messages: list[Message] = []
        after: str | None = None
        try:
            while True:
                page = await self._rt.task.messages(task_id, after=after, limit=PAGE)
                messages += page
                if len(page) < PAGE:
                    break
                after = page[-1].id
        except NotFound:
            return False
        return any(input_id in mark.followup_ids for mark in recover_rounds(messages, kind="operator", key=self.key))


async def _finish(rt: Runtime, task_id: str, *, error: tuple[str, str] | None, answer: str | None = None) -> None:
    try:
        await rt.chat.complete(task_id, error=error, answer=answer)
    except (Conflict, NotFound) as exc:  # completed already (e.g. the other way by an earlier run), or gone
        logger.info("task %s: completion refused (%s); it is being completed already", task_id, exc.message)


class _TaskWork:
    """One reconcile's work on one Task: its calls, its rounds and the calls it started."""

    def __init__(self, rt: Runtime, settings: RouterSettings, key: str, task: Task, context: TaskContext) -> None:
        self._rt = rt
        self._settings = settings
        self._key = key
        self._task = task
        self._request = context.input.text.strip()
        earlier = [m for m in context.history if m.id != context.input.id and _settled(m)]
        self._history = history_text(earlier, has_earlier=context.has_earlier)
        self._calls: list[Call] = []
        self._attempted: list[str] = []  # effect keys whose start was sent (it may have reached the engine)
        self._followups: dict[str, str] | None = None  # follow-up id → text, read once when first needed
        self._recorded: tuple[ProgressMark, ...] | None = None
        """The round boundaries of earlier runs: from the context's messages when they are all there, else read
        while the first batch works (only its end consults them)."""
        if context.messages is not None and not context.more_messages:
            self._recorded = recover_rounds(context.messages, kind="operator", key=key)

    async def answer(self) -> str:
        """Plan, work (round after round while follow-ups arrive), summarize; the answer's text."""
        if not self._request:
            raise TaskFailed("the question has no text to answer")
        evidence: list[Evidence] = []
        covered: list[str] = []
        plan = await self._plan(0, evidence, covered)
        round_ = 0
        while True:
            evidence += await self._work(round_, plan, covered)
            recorded = self._recorded if self._recorded is not None else await self._recorded_rounds()
            if round_ < len(recorded):
                new_ids = recorded[round_].followup_ids  # this boundary was crossed before a restart: replay it
            elif round_ + 1 >= MAX_ROUNDS:
                break
            else:
                new_ids = await self._new_followups(covered)
                if not new_ids:
                    break
                await self._rt.chat.speak(
                    self._task.id, progress_key(round_ + 1), content=progress_content(round_ + 1, new_ids)
                )
            covered += [i for i in new_ids if i not in covered]
            round_ += 1
            plan = await self._plan(round_, evidence, covered)
        followups = await self._texts(covered)
        prompt = summarize_prompt(self._request, self._history, evidence, followups=followups)
        return await self._ask(SUMMARIZE_KEY, prompt)

    async def cancel_running(self) -> None:
        """Cancel the calls this reconcile started that are not known to have ended, and wait (bounded) until the
        engine has stopped them, so nothing of the Task is left running when it completes. Best effort: a call
        that cannot be cancelled or does not stop in time is logged (the engine's deadline still ends it)."""
        cancelled: list[Call] = []
        known = {call.state.effect_key for call in self._calls}
        for key in self._attempted:
            if key in known:
                continue
            # A start whose request was cut short (a sibling failed first) may have reached the engine.
            try:
                found = await self._rt.harness.find(self._task.uid, key)
            except RuntimeApiError as exc:
                logger.warning("task %s: could not look up harness call %s: %s", self._task.id, key, exc.message)
                continue
            if found is not None:
                self._calls.append(found)
        for call in self._calls:
            if call.state.terminal:
                continue
            try:
                await call.cancel()
            except RuntimeApiError as exc:
                logger.warning("task %s: could not cancel harness call %s: %s", self._task.id, call.id, exc.message)
            else:
                cancelled.append(call)
        for call in cancelled:
            try:
                await call.wait(timeout=_CANCEL_WAIT)
            except (TimeoutError, RuntimeApiError) as exc:
                logger.warning("task %s: harness call %s did not stop yet: %s", self._task.id, call.id, exc)

    # -- steps ----------------------------------------------------------------------------------------------

    async def _plan(self, round_: int, evidence: Sequence[Evidence], covered: Sequence[str]) -> Plan:
        limit = self._settings.max_subtasks
        if round_ == 0:
            prompt = plan_prompt(self._request, self._history, max_subtasks=limit)
        else:
            followups = await self._texts(covered)
            prompt = replan_prompt(
                self._request, self._history, max_subtasks=limit, evidence=evidence, followups=followups
            )
        key = plan_key(round_)
        said = await self._ask(key, prompt, empty_ok=True)
        try:
            return parse_plan(said, request=self._request, max_subtasks=limit, replan=round_ > 0)
        except PlanError as exc:
            raise PlanError(f"{key}: {exc}", answer=exc.answer) from None

    async def _work(self, round_: int, plan: Plan, covered: Sequence[str]) -> list[Evidence]:
        """Start every task's call at once and wait for all of them together (each start's own request waits for
        its call); the first failure fails the Task."""
        followups = await self._texts(covered) if covered else []
        keyed = [(work_key(round_, index), task) for index, task in enumerate(plan.tasks)]
        results: dict[str, str] = {}
        try:
            async with asyncio.TaskGroup() as group:
                if self._recorded is None:
                    group.create_task(self._recorded_rounds(), name=f"router:rounds:{self._task.id}")
                for key, task in keyed:
                    prompt = work_prompt(self._request, self._history, task, followups=followups)
                    group.create_task(self._ask(key, prompt, into=results), name=f"router:{key}")
        except BaseExceptionGroup as group:
            raise _first_failure(group) from None
        return [Evidence(task, results[key]) for key, task in keyed]

    async def _ask(self, key: str, prompt: str, *, empty_ok: bool = False, into: dict[str, str] | None = None) -> str:
        """Start (or re-attach to) one call and wait for its text (the start's own request waits already)."""
        call = await self._start(key, prompt, wait=min(float(self._settings.call_timeout), MAX_WAIT))
        results: dict[str, str] = {} if into is None else into
        await self._finished_text(key, call, results, empty_ok=empty_ok)
        return results[key]

    async def _start(self, key: str, prompt: str, *, wait: float = 0.0) -> Call:
        self._attempted.append(key)
        try:
            call = await self._rt.harness.prompt(
                self._task.uid,
                key,
                self._settings.target,
                prompt,
                task_id=self._task.id,
                timeout=float(self._settings.call_timeout),
                output="work",
                wait=wait,
            )
        except Conflict as exc:
            # Started by an earlier run of this reconcile whose prompt differed (e.g. a history message that was
            # still streaming then has ended since): the step is that call — re-attach instead of failing.
            found = await self._rt.harness.find(self._task.uid, key)
            if found is None:
                raise TaskFailed(f"{key}: the harness call was refused: {exc.message}") from exc
            logger.info(
                "task %s: %s re-attached to call %s (started with an earlier prompt)", self._task.id, key, found.id
            )
            call = found
        except (InvalidRequest, NotFound) as exc:
            raise TaskFailed(f"{key}: the harness call was refused: {exc.message}") from exc
        self._calls.append(call)
        return call

    async def _finished_text(self, key: str, call: Call, into: dict[str, str], *, empty_ok: bool = False) -> None:
        try:
            state = await call.wait(timeout=self._settings.call_timeout + _WAIT_GRACE)
        except TimeoutError as exc:
            raise TaskFailed(f"{key}: the harness call did not finish in {self._settings.call_timeout} s") from exc
        except NotFound as exc:
            raise TaskFailed(f"{key}: the harness call is gone: {exc.message}") from exc
        text = _text_of(key, state)
        if not text.strip() and not empty_ok:
            raise TaskFailed(f"{key}: the harness call returned an empty result")
        into[key] = text

    # -- durable facts --------------------------------------------------------------------------------------

    async def _recorded_rounds(self) -> tuple[ProgressMark, ...]:
        """The progress marks of earlier runs of this Task (kept for the rest of this reconcile)."""
        messages: list[Message] = []
        after: str | None = None
        while True:
            page = await self._rt.task.messages(self._task.id, after=after, limit=PAGE)
            messages += page
            if len(page) < PAGE:
                break
            after = page[-1].id
        self._recorded = recover_rounds(messages, kind="operator", key=self._key)
        return self._recorded

    async def _all_followups(self) -> dict[str, str]:
        if self._followups is None:
            found: dict[str, str] = {}
            after: str | None = None
            while True:
                page = await self._rt.task.followups(self._task.id, after=after, limit=PAGE)
                found.update((m.id, m.text) for m in page)
                if len(page) < PAGE:
                    break
                after = page[-1].id
            self._followups = found
        return self._followups

    async def _new_followups(self, covered: Sequence[str]) -> tuple[str, ...]:
        self._followups = None  # read again: new ones may have arrived during the batch
        known = set(covered)
        return tuple(i for i in await self._all_followups() if i not in known)

    async def _texts(self, ids: Sequence[str]) -> list[str]:
        followups = await self._all_followups()
        return [followups.get(i, "") for i in ids if followups.get(i, "").strip()]


def _first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a batch's failure raises: its first `TaskFailed` (the Task fails), else its first error (retried)."""
    failed = group.subgroup(TaskFailed)
    leaves = (failed or group).exceptions
    first = leaves[0]
    return _first_failure(first) if isinstance(first, BaseExceptionGroup) else first


def _settled(message: Message) -> bool:
    """Whether a history message is final (its text no longer changes). Only those go into prompts, so that a
    restarted Router mostly builds the same ones again; when one that was still streaming at the first run has ended
    by a restart, the prompt differs (``Conflict``) and the restarted Router re-attaches to the call it started
    (`HarnessVerbs.find`): a step is its effect key, not its prompt."""
    return message.status != "streaming"


def _text_of(key: str, state: CallState) -> str:
    """The text of a finished call; `TaskFailed` unless it succeeded."""
    if state.phase != "succeeded":
        error = state.error or {}
        detail = str(error.get("message") or error.get("code") or "no reason given")
        raise TaskFailed(f"{key}: the harness call {state.phase.replace('_', ' ')}: {detail}")
    return result_text(state.result) or state.text
