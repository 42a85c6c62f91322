"""The rig: a design-time assembly of loops, journal, workspace and policies; it starts and restores sessions."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loopd._ids import new_id
from loopd.harness._errors import HarnessError, SessionNotFoundError
from loopd.harness.core import codec
from loopd.harness.core._values import Usage
from loopd.harness.core.apply import fold
from loopd.harness.core.decide import recover
from loopd.harness.core.events import SessionRestored, SessionStarted
from loopd.harness.core.state import LoopState
from loopd.harness.gate import MemoryRuleStore, RuleStore
from loopd.harness.journal._protocol import Journal, SessionInfo
from loopd.harness.runtime._budget import UNLIMITED, BudgetPolicy
from loopd.harness.runtime._loop import LoopActor, LoopDefinition
from loopd.harness.runtime._session import Session

RecoveryMode = Literal["interrupt", "resume"]


def _no_pricing(_model: str, usage: Usage) -> Usage:
    return usage


@dataclass(frozen=True)
class Rig:
    """Loops (the first is the default), a journal, and options. Frozen: a rig is a definition, not a process."""

    loops: Sequence[LoopDefinition]
    journal: Journal
    name: str = "rig"
    workspace: Path | None = None
    now: Callable[[], float] = field(default=time.time)
    price: Callable[[str, Usage], Usage] = field(default=_no_pricing)
    rules: RuleStore = field(default_factory=MemoryRuleStore)
    budget: BudgetPolicy = UNLIMITED
    submit_timeout: float = 10.0
    drain_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not self.loops:
            raise ValueError("a rig needs at least one loop")
        names = [loop.name for loop in self.loops]
        if len(set(names)) != len(names):
            raise ValueError("loop names must be unique")

    def _session(self, session_id: str, writer: object) -> Session:
        return Session(
            session_id=session_id,
            rig_name=self.name,
            journal=self.journal,
            writer=writer,  # type: ignore[arg-type]
            now=self.now,
            price=self.price,
            budget=self.budget,
            submit_timeout=self.submit_timeout,
            drain_timeout=self.drain_timeout,
        )

    async def start_session(self, session_id: str | None = None) -> Session:
        """Create a new session (journal first), start its loops and return it."""
        sid = session_id or new_id()
        now = self.now()
        writer = await self.journal.create_session(sid, meta=json.dumps({"rig": self.name}), at=now)
        session = self._session(sid, writer)
        for definition in self.loops:
            session._add_actor(
                LoopActor(
                    session,
                    definition,
                    LoopState(name=definition.name),
                    now=self.now,
                    workspace=self.workspace,
                    rules=self.rules,
                )
            )
        await session._commit_session(
            SessionStarted(session_id=sid, rig=self.name, loops=tuple(d.name for d in self.loops), at=now)
        )
        session._start_actors()
        return session

    async def restore_session(self, session_id: str, *, mode: RecoveryMode = "interrupt") -> Session:
        """Rebuild a session from its journal (fencing any earlier writer) and bring its loops up.

        An open turn is interrupted (``mode="interrupt"``) or resumed (``mode="resume"``) following the
        recovery rule in `loopd.harness.core.decide.recover`.
        """
        writer = await self.journal.open_writer(session_id)
        records = await self.journal.read(session_id)
        if not records:
            raise SessionNotFoundError(session_id)
        state = fold((r.seq, codec.decode(r.kind, r.version, r.data)) for r in records)
        by_name = {d.name: d for d in self.loops}
        unknown = set(state.loops) - set(by_name)
        if unknown:
            await writer.aclose()
            raise HarnessError(f"session {session_id} has loops this rig does not define: {sorted(unknown)}")
        session = self._session(session_id, writer)
        for definition in self.loops:
            loop_state = state.loops.get(definition.name) or LoopState(name=definition.name)
            session._add_actor(
                LoopActor(session, definition, loop_state, now=self.now, workspace=self.workspace, rules=self.rules)
            )
        await session._commit_session(SessionRestored(from_seq=state.last_seq, mode=mode, at=self.now()))
        for actor in session.actors.values():
            decision = recover(
                actor.state,
                config=actor.definition.config,
                mode=mode,
                idempotent=actor.definition.is_idempotent,
                now=self.now(),
            )
            await actor.execute(decision)
        session._start_actors()
        return session

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
