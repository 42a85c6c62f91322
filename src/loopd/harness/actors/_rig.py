"""The rig: a design-time assembly of loops, journal, workspace and policies; it starts and restores sessions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from loopd._infra.clock import Clock, SystemClock
from loopd._infra.ids import new_id
from loopd.harness._errors import (
    ForkPointError,
    ForkWorkspaceError,
    HarnessError,
    SessionNotFoundError,
)
from loopd.harness.actors._budget import UNLIMITED, BudgetPolicy
from loopd.harness.actors._delegation import delegation_tools
from loopd.harness.actors._loop import LoopActor, LoopDefinition
from loopd.harness.actors._session import Session
from loopd.harness.core import Usage, codec
from loopd.harness.core.config import (
    DriftPolicy,
    Primer,
    compose_prompt,
    decide_drift,
    digest,
    limits_digest,
    tool_schemas_digest,
)
from loopd.harness.core.decide import recover
from loopd.harness.core.events import SessionForked, SessionRestored, SessionStarted, WorkspaceForked
from loopd.harness.core.hustles import HustleInfo, LaneLimits, LaneName, on_restore
from loopd.harness.core.state import AgentInfo, LoopState
from loopd.harness.core.workspace import (
    EMPTY_WORKSPACE_HISTORY,
    ForkWorkspace,
    WorkspaceHistory,
    decide_fork_workspace,
    fork_checkpoint,
)
from loopd.harness.gate import MemoryRuleStore, RuleStore
from loopd.harness.journal import (
    DEFAULT_SNAPSHOT_EVERY,
    Journal,
    JournalWriter,
    NewRecord,
    RestoredState,
    SessionInfo,
    StateSnapshots,
    collector_paused,
    last_settled_seq,
    replay,
    restore_state,
    unsettled_loops,
)
from loopd.harness.snapshots import DEFAULT_EXCLUDES, SnapshotPolicy, workspace_is_empty
from loopd.harness.tools import Tool

RecoveryMode = Literal["interrupt", "resume"]
_FORK_LOOKAHEAD = 256
"""Records past a fork point searched for the snapshot taken right after it (a turn end's checkpoint)."""


async def _restore_hustles(session: Session, hustles: Mapping[str, HustleInfo]) -> None:
    """Resume the background runs the journal left open (compactions whose prefix is still there), fail the rest."""
    session.hustles.reset(hustles)
    plan = on_restore(hustles, resumable={"compaction"})
    for info in plan.resume:
        actor = session.actors.get(info.loop or "")
        if actor is not None and actor.resume_compaction(info):
            continue
        await session.hustles.fail(info, "the session restarted and the compaction could not be resumed")
    for info in plan.fail:
        await session.hustles.fail(info, f"the session restarted; a {info.name!r} run is not resumed")


def _no_pricing(_model: str, usage: Usage) -> Usage:
    return usage


@dataclass(frozen=True)
class Rig:
    """Loops (the first is the default), a journal, and options. Frozen: a rig is a definition, not a process."""

    loops: Sequence[LoopDefinition]
    journal: Journal
    name: str = "rig"
    workspace: Path | None = None
    clock: Clock = field(default_factory=SystemClock)
    """Where the rig reads time (event stamps, gate deadlines) and sleeps (gate timers); virtual in tests."""
    price: Callable[[str, Usage], Usage] = field(default=_no_pricing)
    rules: RuleStore = field(default_factory=MemoryRuleStore)
    budget: BudgetPolicy = UNLIMITED
    agents: Sequence[LoopDefinition] = ()
    max_agent_depth: int = 2
    max_agents: int = 8
    submit_timeout: float = 10.0
    drain_timeout: float = 5.0
    primers: Sequence[Primer] = ()
    """Named system-prompt fragments; a loop applies those it names in `LoopDefinition.primers`."""
    on_drift: DriftPolicy = "adopt"
    """A restore under a changed configuration: "adopt" (journal `ConfigurationAdopted`), "refuse"
    (`ConfigurationDriftError`), or a function of the changes (True: adopt)."""
    snapshots: SnapshotPolicy | None = None
    """Workspace snapshots (needs ``workspace``): where the store lives and when sessions checkpoint."""
    lanes: Mapping[LaneName, LaneLimits] | None = None
    """Caps of the background lanes ("blocking", "background") that run compaction (default: `DEFAULT_LANES`)."""
    on_journal_commit: Callable[[float], None] | None = None
    """Told the seconds (on ``clock``) each journal append of a session took to commit, e.g. a metrics histogram's
    ``observe``; must not block or raise."""
    state_snapshots: int | None = DEFAULT_SNAPSHOT_EVERY
    """State snapshots (`loopd.harness.journal.restore_state`): a session saves its state after at least this many
    new records (more as it grows), so a restore folds only the records after the newest one; None: none are
    written or read (restore folds the whole journal)."""
    _fingerprint: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.loops:
            raise ValueError("a rig needs at least one loop")
        names = [loop.name for loop in self.loops]
        if len(set(names)) != len(names):
            raise ValueError("loop names must be unique")
        agent_names = [a.name for a in self.agents]
        if len(set(agent_names)) != len(agent_names) or set(agent_names) & set(names):
            raise ValueError("agent definition names must be unique and differ from loop names")
        if self.max_agent_depth < 1 or self.max_agents < 0:
            raise ValueError("agent limits must be positive")
        if self.state_snapshots is not None and self.state_snapshots < 1:
            raise ValueError("state_snapshots must be at least 1 (or None: no state snapshots)")
        primer_names = [p.name for p in self.primers]
        if len(set(primer_names)) != len(primer_names):
            raise ValueError("primer names must be unique")
        for d in (*self.loops, *self.agents):
            missing = sorted(set(d.primers) - set(primer_names))
            if missing:
                raise ValueError(f"loop {d.name!r} applies primers the rig does not declare: {missing}")

    def system_prompt(self, definition: LoopDefinition) -> str | None:
        """A loop's system prompt with its primers applied (its mode's prompt is added per step)."""
        texts = {p.name: p.text for p in self.primers}
        return compose_prompt(definition.system_prompt, (texts[n] for n in definition.primers), None)

    def fingerprint(self) -> dict[str, str]:
        """The configuration a session records at start and compares on restore: ``aspect → value``. A rig's
        configuration does not change, so it is computed once (each caller gets its own copy)."""
        cached = self._fingerprint
        if cached is None:
            cached = self._compute_fingerprint()
            object.__setattr__(self, "_fingerprint", cached)  # frozen: a cache, not a field anyone sets
        return dict(cached)

    def _compute_fingerprint(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for kind, definitions in (("loop", self.loops), ("agent", self.agents)):
            for d in definitions:
                prefix = f"{kind}:{d.name}:"
                out[prefix + "model"] = d.model_name or d.model.name
                out[prefix + "prompt"] = digest(self.system_prompt(d) or "")
                out[prefix + "tools"] = ",".join(sorted(t.spec.name for t in d.tools))
                if d.modes:
                    out[prefix + "modes"] = ",".join(m.name for m in d.modes)
                    out[prefix + "mode-rules"] = digest(repr(d.modes))
                specs = ((t.spec.name, t.spec.description, t.spec.parameters) for t in d.tools)
                out[prefix + "tool-schemas"] = tool_schemas_digest(specs)
                out[prefix + "limits"] = limits_digest(d.limits())
        return out

    def _actor(
        self, session: Session, definition: LoopDefinition, state: LoopState, name: str, depth: int
    ) -> LoopActor:
        extra: tuple[Tool, ...] = ()
        if self.agents and depth < self.max_agent_depth:
            extra = delegation_tools(session, name, tuple(a.name for a in self.agents))
        if name != definition.name:
            definition = replace(definition, name=name)
        if definition.primers:
            definition = replace(definition, system_prompt=self.system_prompt(definition), primers=())
        return LoopActor(
            session, definition, state, clock=self.clock, workspace=self.workspace, rules=self.rules, extra_tools=extra
        )

    def agent_actor(self, session: Session, name: str, definition: str, state: LoopState, depth: int) -> LoopActor:
        """The loop actor of agent ``name`` of the agent ``definition`` (used by the session's sub-agents)."""
        found = next((a for a in self.agents if a.name == definition), None)
        if found is None:
            raise HarnessError(f"rig {self.name!r} has no agent definition {definition!r}")
        return self._actor(session, found, state, name, depth)

    def _session(
        self,
        session_id: str,
        writer: object,
        agents: Mapping[str, AgentInfo] | None = None,
        workspace_history: WorkspaceHistory = EMPTY_WORKSPACE_HISTORY,
        restored: RestoredState | None = None,
    ) -> Session:
        snapshots = self.snapshots if self.workspace is not None else None
        session = Session(
            session_id=session_id,
            rig_name=self.name,
            journal=self.journal,
            writer=writer,  # type: ignore[arg-type]
            clock=self.clock,
            price=self.price,
            budget=self.budget,
            rig=self,
            agents=agents,
            submit_timeout=self.submit_timeout,
            drain_timeout=self.drain_timeout,
            workspace_store=snapshots.store_for(self.workspace) if snapshots and self.workspace else None,
            snapshot_on=snapshots.on if snapshots else "off",
            workspace_history=workspace_history,
            lanes=self.lanes,
        )
        if self.state_snapshots is not None:  # ``restored``: the state it came back from, and what its snapshot held
            session.log.snapshots = StateSnapshots(
                self.journal,
                session_id,
                lambda: session.state,
                self.clock,
                every=self.state_snapshots,
                saved_seq=0 if restored is None else restored.snapshot_seq,
                header=None if restored is None else restored.state,
                folded=0 if restored is None else len(restored.records),
            )
        return session

    async def start_session(self, session_id: str | None = None, *, with_first_input: bool = False) -> Session:
        """Create a new session (journal first), start its loops and return it.

        ``with_first_input``: the caller submits the session's first input at once (the Harness Engine's built-in
        adapter does): ``session_started`` is then journaled in the same append as what that input starts, instead
        of in one of its own before it (`Session.hold_session_event`; closing the session first stores it alone).
        A crash in between leaves the session created without records, which `restore_session` starts afresh."""
        sid = session_id or new_id()
        now = self.clock.time()
        writer = await self.journal.create_session(sid, meta=json.dumps({"rig": self.name}), at=now)
        return await self._begin_session(sid, writer, now, hold=with_first_input)

    async def _begin_session(self, sid: str, writer: JournalWriter, now: float, *, hold: bool) -> Session:
        """A session whose journal holds no record yet, on its writer: its loops, its ``session_started``."""
        session = self._session(sid, writer)
        for definition in self.loops:
            session.add_actor(self._actor(session, definition, LoopState(name=definition.name), definition.name, 0))
        loops = tuple(d.name for d in self.loops)
        started = SessionStarted(session_id=sid, rig=self.name, loops=loops, at=now, fingerprint=self.fingerprint())
        if hold:
            session.hold_session_event(started)
        else:
            await session.commit_session(started)
        session.start_actors()
        if session.log.snapshots is not None:  # up: its live state is the fold from here on
            session.log.snapshots.release()
        return session

    async def restore_session(
        self, session_id: str, *, mode: RecoveryMode = "interrupt", _shared: RestoredState | None = None
    ) -> Session:
        """Rebuild a session from its journal (fencing any earlier writer) and bring its loops up.

        An open turn is interrupted (``mode="interrupt"``) or resumed (``mode="resume"``) following the
        recovery rule in `loopd.harness.core.decide.recover`. ``_shared`` (`fork_session`'s): the fork's parent
        folded up to the fork point, as `restore_state` gave it — the fork's own records are folded onto it, which is
        what `restore_state` of the fork would fold (the same snapshot, the same records), without doing it twice.
        """
        writer = await self.journal.open_writer(session_id)
        try:
            if _shared is None:  # the newest state snapshot and the records after it (all of them without one)
                try:
                    restored = await restore_state(self.journal, session_id, snapshots=self.state_snapshots is not None)
                except SessionNotFoundError:
                    # Created, but its start never stored (a crash right after `start_session`): nothing happened
                    # in it, so it starts now, on the writer just taken over.
                    return await self._begin_session(session_id, writer, self.clock.time(), hold=False)
            else:
                own = await self.journal.read(session_id, _shared.state.last_seq + 1)
                with collector_paused():
                    folded = replay(own, _shared.state)
                restored = RestoredState(folded, [*_shared.records, *own], _shared.snapshot_seq, _shared.ignored)
        except BaseException:  # corrupt, unknown, or the journal failed: nothing was restored
            await writer.aclose()
            raise
        state = restored.state
        by_name = {d.name: d for d in self.loops}
        agent_defs = {a.name for a in self.agents}
        unknown = set(state.loops) - set(by_name) - set(state.agents)
        unknown |= {f"{a.name} ({a.definition})" for a in state.agents.values() if a.definition not in agent_defs}
        if unknown:
            await writer.aclose()
            raise HarnessError(f"session {session_id} has loops this rig does not define: {sorted(unknown)}")
        try:
            adopted = decide_drift(
                session_id, state.fingerprint, self.fingerprint(), self.on_drift, now=self.clock.time()
            )
        except Exception:  # refused (ConfigurationDriftError), or the policy function failed
            await writer.aclose()
            raise
        fork_problem = self._fork_restore_problem(session_id, state.workspace)
        if fork_problem is not None:
            await writer.aclose()
            raise ForkWorkspaceError(fork_problem)
        session = self._session(session_id, writer, state.agents, state.workspace, restored)
        for definition in self.loops:
            loop_state = state.loops.get(definition.name) or LoopState(name=definition.name)
            session.add_actor(self._actor(session, definition, loop_state, definition.name, 0))
        for info in state.agents.values():
            session.add_actor(self.agent_actor(session, info.name, info.definition, state.loops[info.name], info.depth))
        session.restore_settings(state)
        await session.commit_session(SessionRestored(from_seq=state.last_seq, mode=mode, at=self.clock.time()))
        if adopted is not None:
            await session.commit_session(adopted)
        if state.workspace.pending_fork is not None:  # a fork's restore from its parent's snapshot: finish it
            try:
                await session.workspace.finish_fork()
            except BaseException:
                session.abort()
                raise
        if state.agents:  # the agents' reports look at the whole journal
            everything = restored.records if not restored.snapshot_seq else await self.journal.read(session_id)
            session.subagents.redeliver(everything)
        await _restore_hustles(session, state.hustles)
        for actor in session.running_actors():
            decision = recover(
                actor.state,
                config=actor.definition.config,
                mode=mode,
                idempotent=actor.definition.is_idempotent,
                now=self.clock.time(),
            )
            await actor.execute(decision)
        session.start_actors()
        if session.log.snapshots is not None:  # up: its live state is the fold from here on
            session.log.snapshots.release()
        return session

    def _fork_restore_problem(self, session_id: str, history: WorkspaceHistory) -> str | None:
        """Why this rig cannot finish a fork's journaled workspace restore (None: it can, or none is pending)."""
        ref = history.pending_fork
        if ref is None:
            return None
        if self.snapshots is None or self.workspace is None:
            return f"session {session_id} must restore its workspace from snapshot {ref[:12]}, but this rig takes none"
        if history.directory and Path(history.directory) != self.workspace.resolve():
            return f"session {session_id} works in {history.directory}: restore it with a rig on that directory"
        return None

    async def fork_session(
        self, parent_id: str, at_seq: int, session_id: str | None = None, *, workspace: ForkWorkspace = "keep"
    ) -> Session:
        """Start a new session whose history is ``parent_id``'s up to journal seq ``at_seq``, and bring it up.

        The journal shares the parent's records up to ``at_seq`` (nothing is copied); the fork's own journal
        starts with `SessionForked` at ``at_seq + 1``, and the parent is not touched (it may even be running).
        ``at_seq`` must be a *settled* point — every loop idle, no queued input — because a turn cut in two has
        no single meaning (its effects may be half done): a seq inside a turn is refused with `ForkPointError`,
        whose ``settled`` is the last settled seq before it (fork there instead). `SessionNotFoundError` for an
        unknown parent, `SessionBusyError` if ``session_id`` exists.

        ``workspace``: ``keep`` (default) leaves the rig's workspace as it is now; ``new`` puts it back to the
        parent's snapshot at ``at_seq`` (`loopd.harness.core.workspace.fork_checkpoint`) and requires it to be empty
        (a rig on a new directory: the fork's own workspace); ``overwrite`` does the same over whatever the rig's
        workspace holds (ask first: it may be the parent's). The restore is journaled (`WorkspaceForked`) with the
        fork's first records, before any file is written, and finished by the restore that brings the fork up (a
        crash in between is finished by the next one). `ForkWorkspaceError` when it cannot be done (no snapshots,
        none at or before ``at_seq``, ``new`` on a non-empty directory): then no fork is created. A parent running
        in this process journals a turn end's snapshot just after the turn end: to fork "after the turn that just
        ended", ``await parent.workspace.checkpoints_taken()`` first (``loopd harness serve`` does).
        """
        if at_seq < 1:
            raise ForkPointError(f"cannot fork session {parent_id!r} at seq {at_seq}: seqs start at 1")
        # The parent's state at the fork point: from its (or an ancestor's) snapshot at or before it, so forking a
        # long chain of forks (a conversation's sessions) folds only the records after that snapshot.
        at = await restore_state(self.journal, parent_id, snapshots=self.state_snapshots is not None, upto=at_seq)
        if at.state.last_seq < at_seq:
            records = await self.journal.read(parent_id, 1, at_seq)
            last = at.state.last_seq
            raise ForkPointError(
                f"session {parent_id!r} has seqs 1..{last}; cannot fork at {at_seq}", settled=last_settled_seq(records)
            )
        busy = unsettled_loops(at.state)
        if busy:
            records = await self.journal.read(parent_id, 1, at_seq)
            settled = last_settled_seq(records)
            doing = ", ".join(f"loop {name!r} has {what}" for name, what in sorted(busy.items()))
            hint = f"; the last settled seq before it is {settled}" if settled else ""
            raise ForkPointError(
                f"seq {at_seq} of session {parent_id!r} is inside a turn ({doing}){hint}", settled=settled or None
            )
        sid = session_id or new_id()
        now = self.clock.time()
        restoring = await self._fork_workspace(parent_id, at_seq, workspace, now)
        meta = json.dumps({"rig": self.name, "parent": parent_id, "parent_seq": at_seq})
        writer = await self.journal.fork_session(parent_id, at_seq, sid, meta=meta, at=now)
        try:
            forked = SessionForked(session_id=sid, parent_id=parent_id, parent_seq=at_seq, at=now)
            first: list[SessionForked | WorkspaceForked] = [forked] if restoring is None else [forked, restoring]
            await writer.append([NewRecord(*codec.encode(event), at=now) for event in first])
        finally:
            await writer.aclose()
        # From here the fork is an ordinary stored session: restore brings it up (fencing the writer above), from
        # the parent's state at the fork point folded above.
        return await self.restore_session(sid, _shared=at)

    async def _fork_workspace(
        self, parent_id: str, at_seq: int, mode: ForkWorkspace, now: float
    ) -> WorkspaceForked | None:
        """The `WorkspaceForked` a fork journals (None for ``keep``): the parent's checkpoint at ``at_seq`` and this
        rig's workspace (decided by `decide_fork_workspace`; the I/O is reading the records and the directory)."""
        if mode == "keep":
            return None
        records = await self.journal.read(parent_id, 1, at_seq)
        after = await self.journal.read(parent_id, at_seq + 1, _FORK_LOOKAHEAD)
        with collector_paused():
            events = [(r.seq, codec.decode(r.kind, r.version, r.data)) for r in (*records, *after)]
        directory = self.workspace.resolve() if self.workspace is not None else None
        excludes = self.snapshots.excludes if self.snapshots is not None else DEFAULT_EXCLUDES
        empty = directory is not None and await asyncio.to_thread(workspace_is_empty, directory, excludes)
        return decide_fork_workspace(
            mode,
            fork_checkpoint(events, at_seq),
            parent_id=parent_id,
            parent_seq=at_seq,
            directory=str(directory or ""),
            directory_empty=empty,
            snapshots=self.snapshots is not None and directory is not None,
            now=now,
        )

    @asynccontextmanager
    async def open_session(self, session_id: str | None = None) -> AsyncIterator[Session]:
        """``async with rig.open_session() as s:`` — shut down (draining) on exit."""
        session = await self.start_session(session_id)
        try:
            yield session
        finally:
            await session.shutdown()

    async def sessions(self, *, limit: int = 100) -> list[SessionInfo]:
        return await self.journal.sessions(limit=limit)
