"""FileRuleStore: JSON per workspace, atomic writes, deny beats allow, corrupt files fail closed."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from loopd.harness.gate import (
    FileRuleStore,
    MemoryRuleStore,
    Rule,
    RuleEffect,
    RulePersistenceError,
    RuleStore,
    RuleStoreCorruptError,
    merge_rules,
)

ALLOW_LS = Rule(kind="exec", pattern="ls", effect=RuleEffect.ALLOW)
DENY_LS = Rule(kind="exec", pattern="ls", effect=RuleEffect.DENY)
ALLOW_SRC = Rule(kind="fs.read", pattern="src/*", effect=RuleEffect.ALLOW)


def test_both_stores_are_rule_stores(file_store: FileRuleStore) -> None:
    assert isinstance(file_store, RuleStore)
    assert isinstance(MemoryRuleStore(), RuleStore)


async def test_a_missing_file_is_an_empty_store(file_store: FileRuleStore) -> None:
    assert await file_store.load() == ()


async def test_round_trip(file_store: FileRuleStore) -> None:
    assert await file_store.add([ALLOW_LS, ALLOW_SRC]) == (ALLOW_LS, ALLOW_SRC)
    assert await FileRuleStore(file_store.path).load() == (ALLOW_LS, ALLOW_SRC)
    body = json.loads(file_store.path.read_text())
    assert body["version"] == 1
    assert body["rules"][0] == {"kind": "exec", "pattern": "ls", "effect": "allow", "description": ""}


async def test_adding_twice_does_not_duplicate(file_store: FileRuleStore) -> None:
    await file_store.add([ALLOW_LS])
    await file_store.add([ALLOW_LS, ALLOW_SRC])
    assert await file_store.load() == (ALLOW_LS, ALLOW_SRC)


async def test_deny_beats_allow_on_conflict(file_store: FileRuleStore) -> None:
    await file_store.add([ALLOW_LS])
    await file_store.add([DENY_LS])
    assert await file_store.load() == (DENY_LS,)
    await file_store.add([ALLOW_LS])
    assert await file_store.load() == (DENY_LS,)
    assert merge_rules([DENY_LS], [ALLOW_LS, ALLOW_SRC]) == (DENY_LS, ALLOW_SRC)


@pytest.mark.parametrize("failing", ["replace", "fsync"])
async def test_a_failing_write_leaves_the_old_file_intact(
    file_store: FileRuleStore, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    await file_store.add([ALLOW_LS])
    before = file_store.path.read_bytes()

    def broken(*args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(f"loopd.harness.gate._rules.os.{failing}", broken)
    with pytest.raises(RulePersistenceError, match="Input/output error"):
        await file_store.add([ALLOW_SRC])
    monkeypatch.undo()
    assert file_store.path.read_bytes() == before
    assert await file_store.load() == (ALLOW_LS,)
    leftovers = [p.name for p in file_store.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


async def test_a_corrupt_file_fails_closed(file_store: FileRuleStore) -> None:
    file_store.path.parent.mkdir(parents=True)
    file_store.path.write_text('{"version": 1, "rules": [{"kind": "exec"')
    with pytest.raises(RuleStoreCorruptError):
        await file_store.load()
    with pytest.raises(RulePersistenceError, match="unreadable"):
        await file_store.add([ALLOW_LS])
    assert file_store.path.read_text() == '{"version": 1, "rules": [{"kind": "exec"'


async def test_unknown_versions_and_fields_are_corrupt(file_store: FileRuleStore) -> None:
    file_store.path.parent.mkdir(parents=True)
    bodies: list[object] = [{"version": 2, "rules": []}, {"version": 1, "rules": [], "extra": True}, []]
    for body in bodies:
        file_store.path.write_text(json.dumps(body))
        with pytest.raises(RuleStoreCorruptError):
            await file_store.load()


async def test_concurrent_adds_keep_every_rule(file_store: FileRuleStore) -> None:
    rules = [Rule(kind="exec", pattern=f"cmd-{i}", effect=RuleEffect.ALLOW) for i in range(8)]
    stores = [FileRuleStore(file_store.path) for _ in rules]
    await asyncio.gather(*(store.add([rule]) for store, rule in zip(stores, rules, strict=True)))
    assert sorted(r.pattern for r in await file_store.load()) == sorted(r.pattern for r in rules)


async def test_a_held_lock_times_out_as_a_persistence_failure(rules_path: Path) -> None:
    import fcntl

    rules_path.parent.mkdir(parents=True)
    fd = os.open(str(rules_path) + ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        store = FileRuleStore(rules_path, timeout=0.2)
        with pytest.raises(RulePersistenceError):
            await store.add([ALLOW_LS])
    finally:
        os.close(fd)
    assert not rules_path.exists()


def test_for_workspace_uses_the_protected_directory(tmp_path: Path) -> None:
    assert FileRuleStore.for_workspace(tmp_path).path == tmp_path / ".loopd" / "gate-rules.json"


async def test_memory_store_failure_injection() -> None:
    store = MemoryRuleStore([ALLOW_LS])
    store.fail_adds()
    with pytest.raises(RulePersistenceError):
        await store.add([ALLOW_SRC])
    assert await store.load() == (ALLOW_LS,)
    store.fail_adds(False)
    assert await store.add([ALLOW_SRC]) == (ALLOW_LS, ALLOW_SRC)
