"""Answers: exactly three; "always" persists before the grant; a persistence failure grants nothing; timeout → deny."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from loopd._infra.clock import settle
from loopd.harness.gate import (
    GATE_TIMEOUT_DEFAULT,
    AccessConfig,
    FileRuleStore,
    GateAnswer,
    GateDecision,
    GatePrompt,
    MemoryRuleStore,
    Rule,
    RuleEffect,
    RulePersistenceError,
    Verdict,
    after_answer,
    answer_on_timeout,
    evaluate,
    resolve_answer,
)
from loopd.harness.tools._protocol import GrantCandidate, PreparedCall, Requirement


def batch() -> list[PreparedCall]:
    def req(kind: str, match: str, *candidates: str) -> Requirement:
        return Requirement(
            kind=kind,
            scope="/ws",
            match=match,
            description=f"{kind} {match}",
            candidates=tuple(GrantCandidate(kind=kind, pattern=c) for c in candidates),
        )

    return [
        PreparedCall(call_id="c1", tool="read_file", arguments={}, requirements=(req("fs.read", "a.py", "a.py", "*"),)),
        PreparedCall(call_id="c2", tool="bash", arguments={}, requirements=(req("exec", "make", "make"),)),
    ]


def open_gate(stored: Sequence[Rule] = ()) -> tuple[GateDecision, GatePrompt]:
    decision = evaluate(batch(), access=AccessConfig(), stored=stored)
    assert decision.prompt is not None
    return decision, decision.prompt


def test_there_are_exactly_three_answers() -> None:
    assert [a.value for a in GateAnswer] == ["approve", "approve_always", "deny"]


def test_timeout_is_five_minutes_and_answers_deny() -> None:
    assert GATE_TIMEOUT_DEFAULT == 300.0
    assert answer_on_timeout() is GateAnswer.DENY


async def test_approve_grants_once_and_stores_nothing() -> None:
    decision, prompt = open_gate()
    store = MemoryRuleStore()
    resolution = await resolve_answer(prompt, GateAnswer.APPROVE, store)
    assert (resolution.granted, resolution.call_ids, resolution.persisted) == (True, ("c1", "c2"), ())
    assert store.add_calls == 0
    final = after_answer(decision, resolution.answer, granted=resolution.granted)
    assert final.call_ids(Verdict.ALLOW) == ("c1", "c2")
    assert final.prompt is None


async def test_deny_grants_nothing() -> None:
    decision, prompt = open_gate()
    store = MemoryRuleStore()
    resolution = await resolve_answer(prompt, GateAnswer.DENY, store)
    assert not resolution.granted
    assert store.add_calls == 0
    assert after_answer(decision, resolution.answer, granted=False).call_ids(Verdict.DENY) == ("c1", "c2")


async def test_always_persists_every_shown_candidate_then_grants() -> None:
    _, prompt = open_gate()
    store = MemoryRuleStore()
    resolution = await resolve_answer(prompt, GateAnswer.APPROVE_ALWAYS, store)
    assert resolution.granted
    expected = {("fs.read", "a.py"), ("fs.read", "*"), ("exec", "make")}
    assert {(r.kind, r.pattern) for r in store.rules} == expected
    assert {(r.kind, r.pattern) for r in resolution.persisted} == expected
    assert all(r.effect is RuleEffect.ALLOW for r in store.rules)
    # The next batch needs no prompt.
    assert evaluate(batch(), access=AccessConfig(), stored=store.rules).prompt is None


class SlowStore(MemoryRuleStore):
    """Holds `add` until released, to observe that no grant exists before the rules are stored."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def add(self, rules: Sequence[Rule]) -> tuple[Rule, ...]:
        self.entered.set()
        await self.release.wait()
        return await super().add(rules)


async def test_always_persists_before_the_grant() -> None:
    _, prompt = open_gate()
    store = SlowStore()
    task = asyncio.create_task(resolve_answer(prompt, GateAnswer.APPROVE_ALWAYS, store))
    await asyncio.wait_for(store.entered.wait(), 30)
    await settle()  # everything that can run without the store has run
    assert not task.done()  # no resolution (no grant) while the rules are not stored
    assert store.rules == ()
    store.release.set()
    resolution = await asyncio.wait_for(task, 30)
    assert resolution.granted
    assert len(store.rules) == 3


async def test_cancelled_while_persisting_grants_nothing() -> None:
    _, prompt = open_gate()
    store = SlowStore()
    task = asyncio.create_task(resolve_answer(prompt, GateAnswer.APPROVE_ALWAYS, store))
    await asyncio.wait_for(store.entered.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_persistence_failure_grants_nothing() -> None:
    decision, prompt = open_gate()
    store = MemoryRuleStore(fail_adds=True)
    resolution = await resolve_answer(prompt, GateAnswer.APPROVE_ALWAYS, store)
    assert not resolution.granted
    assert resolution.error is not None and "injected failure" in resolution.error
    assert resolution.persisted == ()
    assert store.rules == ()
    assert after_answer(decision, resolution.answer, granted=resolution.granted).call_ids(Verdict.DENY) == (
        "c1",
        "c2",
    )


async def test_a_file_store_failure_grants_nothing_and_keeps_the_old_file(
    file_store: FileRuleStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await file_store.add([Rule(kind="exec", pattern="ls", effect=RuleEffect.ALLOW)])
    before = file_store.path.read_bytes()

    def broken_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("loopd.harness.gate._rules.os.replace", broken_replace)
    _, prompt = open_gate()
    resolution = await resolve_answer(prompt, GateAnswer.APPROVE_ALWAYS, file_store)
    assert not resolution.granted
    assert resolution.error is not None and "No space left" in resolution.error
    assert file_store.path.read_bytes() == before
    assert sorted(p.name for p in file_store.path.parent.iterdir()) == ["gate-rules.json", "gate-rules.json.lock"]


async def test_an_open_gate_survives_restore(file_store: FileRuleStore) -> None:
    # The runtime journals the decision when the gate opens; after a restore it resolves the same prompt.
    decision, _ = open_gate()
    journaled = decision.model_dump_json()
    restored = GateDecision.model_validate_json(journaled)
    assert restored == decision
    assert restored.prompt is not None
    resolution = await resolve_answer(restored.prompt, GateAnswer.APPROVE_ALWAYS, FileRuleStore(file_store.path))
    assert resolution.granted
    assert len(await file_store.load()) == 3


async def test_the_unattended_answer_never_persists(tmp_path: Path) -> None:
    from loopd.harness.gate import DEFAULT_POLICY

    _, prompt = open_gate()
    store = MemoryRuleStore()
    resolution = await resolve_answer(prompt, DEFAULT_POLICY.unattended, store)
    assert not resolution.granted
    assert store.add_calls == 0


def test_errors_are_harness_errors() -> None:
    from loopd.harness._errors import HarnessError

    assert issubclass(RulePersistenceError, HarnessError)
