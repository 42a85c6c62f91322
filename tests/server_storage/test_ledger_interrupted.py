"""The ledger roll-up of attempts cut short (every store): an ``attempt.failed`` may say what the failed try spent,
marked as an estimate (counted, and the totals say they are estimated) or as unknown (``usage`` null: not
counted, the totals say they are a lower bound). Either way the attempt is resolved, not "unresolved"."""

from __future__ import annotations

import pytest

from loopd.server.ledger import (
    Attempt,
    LaneRecorder,
    LedgerStore,
    Scope,
    Usage,
    completed,
    failed,
    requested,
)
from loopd.server.storage import InvalidRecord

from .test_ledger import world

INTERRUPTED = {"code": "interrupted", "message": "the drive of this attempt was cut short"}


async def test_interrupted_attempts_are_resolved_and_their_usage_is_marked(ledger: LedgerStore) -> None:
    w = await world(ledger, task_id="t1", conversation_id="c1", harness_call_id="call-1")
    recorder = LaneRecorder(ledger, w.lane)
    done = await ledger.create_attempt(Attempt(w.action.id))
    await recorder.append([requested(done, w.actor.id), completed(done, w.actor.id, usage=Usage(100, 20, 0.5))])
    estimated = await ledger.create_attempt(Attempt(w.action.id))
    unknown = await ledger.create_attempt(Attempt(w.action.id))
    plain = await ledger.create_attempt(Attempt(w.action.id))
    await recorder.append([requested(estimated, w.actor.id), requested(unknown, w.actor.id)])
    await recorder.append([requested(plain, w.actor.id)])
    assert len(await ledger.unresolved_attempts(Scope(task_id="t1"))) == 3  # still in doubt

    reason = {"reason": "interrupted"}
    await recorder.append(
        [
            failed(estimated, w.actor.id, error=INTERRUPTED, payload=reason, usage=Usage(40, 8), usage_estimated=True),
            failed(unknown, w.actor.id, error=INTERRUPTED, payload=reason, usage_estimated=True),
            failed(plain, w.actor.id, error={"code": "x", "message": "refused"}),
        ]
    )
    assert await ledger.unresolved_attempts(Scope(task_id="t1")) == []

    totals = await ledger.usage(Scope(harness_call_id="call-1"))
    assert (totals.input_tokens, totals.output_tokens, totals.cost_usd) == (140, 28, 0.5)  # the estimate counts
    assert totals.completed_attempts == 1
    assert totals.estimated_attempts == 2 and totals.usage_estimated  # the estimate and the unknown one
    events = {e.subject_id: e for e in (await ledger.load_lane(w.lane.id)) if e.event_type == "attempt.failed"}
    assert events[unknown.id].payload["usage"] is None and events[unknown.id].payload["usage_estimated"] is True
    assert events[estimated.id].payload["usage"] == {"input_tokens": 40, "output_tokens": 8, "cost_usd": 0.0}


async def test_exact_totals_say_so_and_a_bad_estimate_flag_is_refused(ledger: LedgerStore) -> None:
    w = await world(ledger, task_id="t2")
    recorder = LaneRecorder(ledger, w.lane)
    attempt = await ledger.create_attempt(Attempt(w.action.id))
    await recorder.append([requested(attempt, w.actor.id), completed(attempt, w.actor.id, usage=Usage(1, 2, 0.25))])
    exact = await ledger.usage(Scope(task_id="t2"))
    assert (exact.estimated_attempts, exact.usage_estimated) == (0, False)

    other = await ledger.create_attempt(Attempt(w.action.id))
    bad = failed(other, w.actor.id, error=INTERRUPTED, payload={"usage_estimated": "yes"})
    with pytest.raises(InvalidRecord):
        await recorder.append([requested(other, w.actor.id), bad])
    looks_alike = failed(other, w.actor.id, error={"code": "x", "message": "usage_estimated"})
    await recorder.append([requested(other, w.actor.id), looks_alike])  # a mention is not a mark
    assert (await ledger.usage(Scope(task_id="t2"))).usage_estimated is False
