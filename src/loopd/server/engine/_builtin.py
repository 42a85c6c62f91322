"""`BuiltinHarnessAdapter`: loopd's own harness, in process, over a `Rig` (e.g. `open_standard_rig`).

The harness session id *is* the call id, so the journal names the execution and no second one can exist:

- ``start``: create session ``call_id`` (if the journal already has it — a crash between the engine's
  "starting" and here — it is restored instead), then submit the prompt (task text + visible history);
- ``resume``: ``rig.restore_session(call_id, mode="resume")`` (fencing any earlier writer; a model call in
  flight is re-issued, a tool is re-run only if idempotent) and submit the prompt only if the journal shows it
  never started a turn;
- updates: ``session.subscribe(from_seq=1)`` replays the journal in order and then follows live events, through
  `HarnessTranslator`, so a resumed run yields the same durable updates as the first one (the engine skips those
  it applied already). The subscription is taken *before* the prompt is submitted, so the live text of a new
  call arrives from its first piece;
- gates: ``session.answer_gate`` (approve / approve_always / deny); cancel: ``session.interrupt``;
- follow-ups (`BuiltinRun.add_input`): a user's input sent to the running session under the command id
  ``followup:<input message id>``, only while the call's turn runs: by the harness's queued-input rule it is
  folded into the turn at the next step boundary, or starts the next turn, which the call then answers too
  (`HarnessTranslator`).

Closing a run after the call's turn ended shuts the session down; closing it earlier (the engine stops or
crashes) aborts the in-process session without a final record, so the journal stays resumable.

Prompts (``prompts``, a `PromptRecording`): each opened session gets its own `PromptLog`, bound around opening it
(`loopd.harness.models.record_model_calls`), so the session's model calls — through a `recording_rig` — report
there; each `ModelCalled` of this run then carries the recorded request and reply of its attempts to the trail.

A call with its own workspace and tools profile (`AdapterRequest.workspace` / ``tools``) runs on the rig
``workspaces.rig(location, profile)`` derives (`loopd.harness.standard.WorkspaceRigs`): the directory under the
workspaces root (created on demand), the profile's tools and its unattended gate policy. Start and resume build the
same rig from the call's stored parameters. Without ``workspaces`` such a call fails (the engine refuses it first).

A call that starts as a fork (`AdapterRequest.fork`) on a rig that takes workspace snapshots also puts its
workspace back, in place, to the snapshot of the fork point — the files the source call's turn found
(`Rig.fork_session(..., workspace="overwrite")`, journaled before a file is written); without a snapshot there
(taken before snapshots were on) it keeps the workspace as it is, as without snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, Final, cast

from loopd.harness import (
    ForkPointError,
    ForkWorkspaceError,
    HarnessError,
    SessionBusyError,
    SessionNotFoundError,
    SubscriptionLostError,
    UnknownSettingError,
    UserInput,
)
from loopd.harness.actors import Rig, Session, Subscription
from loopd.harness.core import SessionState
from loopd.harness.foreign import ForeignEngine
from loopd.harness.journal import last_settled_seq, replay, restore_state, unsettled_loops
from loopd.harness.models import record_model_calls, recording
from loopd.harness.standard import TOOLS_PROFILES, ToolsProfile, WorkspaceLocationError, WorkspaceRigs
from loopd.server.ledger import EffectKind, Idempotency

from ._adapter import AdapterRequest, Failed, GateAnswer, ModelCalled, Update
from ._errors import AdapterError, ObservationLost
from ._prompts import PromptLog, PromptRecording
from ._translation import HarnessTranslator, followup_command_id

_log = logging.getLogger(__name__)

_WIRE_ANSWER: Final[dict[str, str]] = {"approve": "approve", "always": "approve_always", "deny": "deny"}
MODE_OPTION: Final = "mode"
"""The call option (`AdapterRequest.options`) naming the mode the call's main loop runs in (e.g. ``plan``): set on
its session before its input is submitted, so the call's turn starts in it (a loop's mode never changes mid-batch).
The empty string names the loop's own default mode: a call that goes on from an earlier call's session (a fork at
its end) would otherwise keep the mode that session ended in. loop-server's responder sets it from the
conversation's mode."""
ENDS_KEPT: Final = 1024
"""Sessions whose settled end an adapter remembers (`BuiltinHarnessAdapter.end_point` then reads no state)."""
_SHUTDOWN_TIMEOUT: Final = 10.0
_INPUT_TIMEOUT: Final = 5.0


class BuiltinRun:
    """One observed session of the built-in harness."""

    def __init__(
        self,
        session: Session,
        rig: Rig,
        loop: str | None,
        prompts: PromptLog | None = None,
        ended: Callable[[str, int], None] | None = None,
    ) -> None:
        self._session = session
        self._ended = ended
        """Told (session id, last seq) when the session shut down settled after the call's turn."""
        self._prompts = prompts
        self._live_after = session.last_seq
        """Model calls reported after this seq were made by this run: their recorded prompts belong to them."""
        main = loop or session.default_loop
        definition = next((d for d in rig.loops if d.name == main), rig.loops[0])
        self.default_mode: str | None = definition.mode or (definition.modes[0].name if definition.modes else None)
        """The main loop's own mode (what an empty `MODE_OPTION` asks for); None: it declares no modes."""

        def effects(name: str) -> tuple[EffectKind, Idempotency]:
            for tool in definition.tools:
                if tool.spec.name == name:
                    return EffectKind(str(tool.effect)), Idempotency(str(tool.idempotency))
            return EffectKind.UNKNOWN, Idempotency.UNKNOWN

        model_name = definition.model_name or definition.model.name
        self._translator = HarnessTranslator(model_name=model_name, main_loop=main, tool_effects=effects)
        self._main = main
        self._subscription: Subscription | None = session.subscribe(from_seq=1)
        self._first_seq = 1  # a forked session's call starts after its shared history (`start_after`)
        self._base_turns = 0

    @property
    def execution_ref(self) -> str | None:
        return self._session.id

    @property
    def main_loop(self) -> str:
        """The loop whose turn answers the call."""
        return self._main

    @property
    def replays(self) -> bool:
        return True

    @property
    def goes_on(self) -> bool:
        """Whether the session already held answered turns of its main loop when the call's own began (a call that
        goes on from an earlier answer's session)."""
        return self._base_turns > 0

    async def start_after(self, seq: int, turns: int) -> None:
        """For a forked session: its history up to ``seq`` (``turns`` turns of the main loop) is the parent's, so
        the call's updates start after it and its input counts as submitted only once a later turn took it."""
        if self._subscription is not None:
            await self._subscription.aclose()
        self._subscription = self._session.subscribe(from_seq=seq + 1)
        self._first_seq, self._base_turns = seq + 1, turns

    async def submit_once(self, prompt: str, *, mode: str | None = None) -> None:
        """Submit the call's input unless the session already took one (its journal shows a turn or a queue);
        ``mode``: the main loop's mode for it, set first when it differs (`MODE_OPTION`)."""
        loop = self._session.state.loops.get(self._main)
        if loop is not None and (loop.turns > self._base_turns or loop.turn is not None or loop.queued):
            return
        if mode is not None and (loop is None or loop.mode != mode):
            try:
                await self._session.set_loop_mode(mode, loop=self._main)
            except UnknownSettingError as exc:  # e.g. a foreign loop: it declares no modes
                raise AdapterError(f"this harness has no mode {mode!r}: {exc}") from exc
        await self._session.submit(prompt, loop=self._main)

    async def updates(self) -> AsyncIterator[Update]:
        next_seq = self._first_seq
        while True:
            sub, self._subscription = self._subscription or self._session.subscribe(from_seq=next_seq), None
            try:
                async for envelope in sub:
                    if envelope.seq is not None:
                        next_seq = envelope.seq + 1
                    for update in self._translator.feed(envelope.event):
                        if (
                            self._prompts is not None
                            and isinstance(update, ModelCalled)
                            and (envelope.seq is None or envelope.seq > self._live_after)
                        ):
                            recorded = self._prompts.take(update.input_tokens, update.output_tokens)
                            update = replace(update, recorded=recorded) if recorded is not None else update
                        elif self._prompts is not None and isinstance(update, Failed):
                            lost = self._prompts.take_failed()  # model calls whose every attempt failed
                            update = replace(update, recorded=tuple(lost)) if lost else update
                        yield update
                    if self._translator.finished:
                        return
            except SubscriptionLostError as exc:
                next_seq = exc.last_seq + 1
                continue
            finally:
                await sub.aclose()
            fault = self._session.fault
            raise ObservationLost(str(fault) if fault is not None else "the harness session stopped mid-turn")

    async def answer_gate(self, gate_id: str, answer: GateAnswer) -> None:
        await self._session.answer_gate(gate_id, _WIRE_ANSWER[answer], loop=self._main)

    async def provide_user_input(self, request_id: str, text: str) -> None:
        """Answer the session's open ask_user question ``request_id`` (see `AnswersQuestions`)."""
        await self._session.provide_user_input(request_id, text, loop=self._main)

    async def add_input(self, text: str, *, key: str) -> bool:
        """Send a user's follow-up into the running turn (see the module docstring); False once the turn ended."""
        command_id = followup_command_id(key)
        loop = self._session.state.loops.get(self._main)
        if loop is not None and (
            command_id in self._translator.followups or any(queued.command_id == command_id for queued in loop.queued)
        ):
            return True  # delivered before (this run, or the journal it replayed)
        if self._translator.finished or loop is None or loop.turn is None or self._session.status != "active":
            return False
        try:
            command = UserInput(command_id=command_id, loop=self._main, text=text)
            await self._session.send(command, timeout=_INPUT_TIMEOUT)
        except HarnessError:
            return False
        return True

    async def cancel(self) -> None:
        with contextlib.suppress(HarnessError):
            await self._session.interrupt(reason="cancelled by the harness engine")

    async def aclose(self) -> None:
        if self._subscription is not None:
            await self._subscription.aclose()
            self._subscription = None
        if self._translator.finished or self._session.status != "active":
            try:
                async with asyncio.timeout(_SHUTDOWN_TIMEOUT):
                    await self._session.shutdown(drain_timeout=0, reason="harness call ended")
            except (TimeoutError, HarnessError):
                self._session.abort()
                return
            if self._ended is not None and self._translator.finished and not unsettled_loops(self._session.state):
                self._ended(self._session.id, self._session.last_seq)
        else:
            self._session.abort()


class BuiltinHarnessAdapter:
    """The in-process harness over ``rig`` (which the caller keeps open). ``loop``: the loop that answers."""

    def __init__(
        self,
        rig: Rig,
        *,
        loop: str | None = None,
        workspaces: WorkspaceRigs | None = None,
        prompts: PromptRecording | None = None,
        forks: bool = True,
        continues: bool = True,
    ) -> None:
        self._rig = rig
        self._loop = loop
        self._workspaces = workspaces
        self._prompts = prompts
        self._forks = forks
        self._continues = continues
        """Whether a new call may go on from an earlier call's session (`end_point`; False: it never says where)."""
        self._ends: OrderedDict[str, int] = OrderedDict()
        """Sessions of this adapter's runs that shut down settled, and their last seq (the last `ENDS_KEPT`)."""

    @property
    def supports_resume(self) -> bool:
        return True

    @property
    def supports_inputs(self) -> bool:
        """Its runs take users' follow-ups (`BuiltinRun.add_input`)."""
        return True

    @property
    def supports_workspaces(self) -> bool:
        """Whether calls may name their own workspace and tools profile (``workspaces`` was given)."""
        return self._workspaces is not None

    async def _rig_for(self, request: AdapterRequest) -> Rig:
        if request.workspace is None and request.tools is None:
            return self._rig
        if self._workspaces is None:
            raise AdapterError("this harness takes no workspace or tools profile")
        if (request.tools or "read") not in TOOLS_PROFILES:
            raise AdapterError(f"unknown tools profile {request.tools!r}")
        profile = cast(ToolsProfile, request.tools or "read")
        workspaces, location = self._workspaces, request.workspace
        try:  # creating the directory is file-system work: off the event loop
            return await asyncio.to_thread(workspaces.rig, location, profile)
        except (WorkspaceLocationError, OSError) as exc:
            raise AdapterError(f"workspace {location!r}: {exc}") from exc

    @property
    def effect(self) -> tuple[EffectKind, Idempotency]:
        return EffectKind.WRITE, Idempotency.KEYED

    async def start(self, request: AdapterRequest) -> BuiltinRun:
        return await self._open(request)

    async def resume(self, request: AdapterRequest, execution_ref: str | None) -> BuiltinRun:
        return await self._open(request)

    @property
    def supports_forks(self) -> bool:
        """Calls may start as a fork of an earlier session of this harness (`AdapterRequest.fork`), unless ``forks``
        was False (a foreign loop: its CLI's own session, outside the journal, would be shared by both)."""
        return self._forks

    async def _start_or_fork(self, rig: Rig, request: AdapterRequest) -> Session:
        """The call's new session: a fork of ``request.fork`` (session id, seq) when given, else a fresh one."""
        if request.fork is None:  # its opening is journaled with what the call's input starts (`_open` submits it)
            return await rig.start_session(request.call_id, with_first_input=True)
        parent, seq = request.fork
        try:
            if rig.snapshots is not None and rig.workspace is not None:
                try:  # the workspace as the source turn found it (its snapshot), in place: the call works there
                    return await rig.fork_session(parent, seq, request.call_id, workspace="overwrite")
                except ForkWorkspaceError as exc:  # e.g. taken before snapshots were on; no fork was made
                    _log.warning("fork of harness session %s keeps the workspace as it is: %s", parent, exc)
            return await rig.fork_session(parent, seq, request.call_id)
        except (ForkPointError, SessionNotFoundError) as exc:
            raise AdapterError(f"cannot fork harness session {parent} at seq {seq}: {exc}") from exc

    async def _skip_shared_history(
        self,
        rig: Rig,
        run: BuiltinRun,
        session_id: str,
        forked: SessionState | None = None,
        parent_seq: int | None = None,
    ) -> None:
        """A session forked for this call (now or before a crash) answers after the history it shares.
        ``forked``: the state of a fork just made (its loops are the parent's at the fork point) and ``parent_seq``
        the seq it was made at — both known, so the journal is not asked."""
        if forked is None or parent_seq is None:
            info = await rig.journal.session(session_id)
            if info is None or info.parent_id is None:
                return
            parent_seq = info.parent_seq
        if forked is None:
            shared = await restore_state(
                rig.journal, session_id, snapshots=rig.state_snapshots is not None, upto=parent_seq
            )
            forked = shared.state
        main = forked.loops.get(run.main_loop)
        await run.start_after(parent_seq, main.turns if main is not None else 0)

    def _ended(self, session_id: str, seq: int) -> None:
        self._ends[session_id] = seq
        self._ends.move_to_end(session_id)
        while len(self._ends) > ENDS_KEPT:
            self._ends.popitem(last=False)

    async def end_point(self, request: AdapterRequest, session_id: str) -> int | None:
        """The last seq of ``session_id`` (a call's session; ``request`` picks its rig) when the session is settled
        there — its turn ended, nothing queued — so a new call can go on from it (a fork at that seq); None when it
        is not, or has no records. A session this adapter's run shut down settled is known (its journal still ending
        there); any other is folded from its newest snapshot, so a long chain of such sessions stays cheap."""
        if not self._continues:
            return None
        rig = await self._rig_for(request)
        known = self._ends.get(session_id) if rig is self._rig else None
        if known is not None:
            info = await rig.journal.session(session_id)
            if info is not None and info.last_seq == known:
                return known
        try:
            at = await restore_state(rig.journal, session_id, snapshots=rig.state_snapshots is not None)
        except SessionNotFoundError:
            return None
        return None if unsettled_loops(at.state) else at.state.last_seq

    async def fork_point(self, request: AdapterRequest, session_id: str) -> int:
        """The settled seq of ``session_id`` (a call's session; ``request`` picks its rig) just before the call's
        own first turn took its input: a fork there answers that input again from the same harness state."""
        rig = await self._rig_for(request)
        info = await rig.journal.session(session_id)
        if info is None:
            raise AdapterError(f"no harness session {session_id}")
        first_own = info.parent_seq + 1 if info.parent_id is not None else 1
        state: SessionState | None = None
        settled = 0  # the last seq so far after which every loop is settled
        if first_own > 1:
            # A fork (a later question going on from an earlier answer's session): what it shares with its
            # parents is their state at the fork, from their newest snapshot at or before it — not the whole chain.
            shared = await restore_state(
                rig.journal, session_id, snapshots=rig.state_snapshots is not None, upto=first_own - 1
            )
            state = shared.state
            if unsettled_loops(state):  # never made by this adapter (it forks at settled points): fold it all
                return max(last_settled_seq(await rig.journal.read(session_id, 1)), 1)
            settled = first_own - 1
        for record in await rig.journal.read(session_id, first_own):
            state = replay([record], state)
            if unsettled_loops(state):  # the call's input was taken here: fork just before
                break
            settled = record.seq
        return max(settled, 1)

    async def _open(self, request: AdapterRequest) -> BuiltinRun:
        session_id = request.call_id
        rig = await self._rig_for(request)
        session: Session
        # The session's tasks are created inside this context: their model calls report to its prompt log.
        parent = request.fork[0] if request.fork is not None else None
        log = self._prompts.log(session_id, parent=parent) if self._prompts is not None else None
        fresh: SessionState | None = None  # the state of a session made just now (not restored)
        with record_model_calls(log):
            # A session of its own is simply created: the journal refuses one that exists (a crash after its start,
            # or a start running concurrently), which is then taken over. A fork is looked for first: making one
            # sets up its workspace before the journal would refuse it.
            if request.fork is None or await rig.journal.session(session_id) is None:
                try:
                    session = await self._start_or_fork(rig, request)
                    fresh = session.state
                except SessionBusyError:  # made before or concurrently: take it over
                    session = await rig.restore_session(session_id, mode="resume")
            else:
                session = await rig.restore_session(session_id, mode="resume")
        run = BuiltinRun(session, rig, self._loop, log, self._ended if rig is self._rig else None)
        try:
            if fresh is None:  # restored: whether (and where) it was forked is in the journal
                await self._skip_shared_history(rig, run, session_id)
            elif request.fork is not None:  # forked just now, at the seq the request names
                await self._skip_shared_history(rig, run, session_id, fresh, request.fork[1])
            mode = request.options.get(MODE_OPTION)
            if mode == "":
                mode = run.default_mode
            prompt = request.prompt(since_last_answer=run.goes_on)
            await run.submit_once(prompt, mode=mode if isinstance(mode, str) and mode else None)
        except BaseException:
            session.abort()
            raise
        return run


def recording_rig(rig: Rig) -> Rig:
    """``rig`` whose loops' and agents' models report their calls (`loopd.harness.models.RecordingModel`): what
    the built-in adapter's prompt recording needs. Without a bound log they behave exactly as before."""

    def wrap(definition: Any) -> Any:
        if isinstance(definition.model, ForeignEngine):  # a foreign CLI runs whole turns: no model calls to record
            return definition
        return replace(definition, model=recording(definition.model))

    return replace(rig, loops=[wrap(loop) for loop in rig.loops], agents=[wrap(agent) for agent in rig.agents])
