"""Test helpers for the harness: collecting events, checking journals."""

from __future__ import annotations

import asyncio

from loopd.harness import Journal, Session, Subscription
from loopd.harness.actors import Envelope
from loopd.harness.core import SessionState, codec, fold


async def collect_until(sub: Subscription, kinds: set[str], *, timeout: float = 30.0) -> list[Envelope]:
    """Collect envelopes until one whose kind is in ``kinds`` arrives (inclusive)."""
    out: list[Envelope] = []
    async with asyncio.timeout(timeout):
        async for env in sub:
            out.append(env)
            if env.event.kind in kinds:
                break
    return out


async def journal_state(journal: Journal, session_id: str) -> SessionState:
    records = await journal.read(session_id)
    return fold((r.seq, codec.decode(r.kind, r.version, r.data)) for r in records)


async def assert_gap_free(journal: Journal, session_id: str) -> int:
    records = await journal.read(session_id)
    seqs = [r.seq for r in records]
    assert seqs == list(range(1, len(seqs) + 1)), f"gap or disorder in {seqs[:20]}..."
    return len(seqs)


def same_loops(a: SessionState, b: SessionState) -> None:
    assert dict(a.loops) == dict(b.loops)


async def settle(session: Session, timeout: float = 30.0) -> None:
    await session.wait_idle(timeout=timeout)
