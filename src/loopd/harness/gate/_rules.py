"""Rule stores (per workspace) and resolving a prompt's answer into a grant.

`resolve_answer` is the only place a grant is minted. For "Approve always" it stores every shown grant first —
all or nothing — and mints the grant only after the store has confirmed; if storing fails nothing is granted and
the gated calls are denied.

`FileRuleStore` keeps one JSON file per workspace. Writes are atomic (temporary file, fsync, ``os.replace``,
fsync of the directory) and serialized across processes with an advisory lock; a failed write leaves the old
file as it was. When the same kind and pattern is both allowed and denied, the deny is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from loopd._infra.files import write_atomically
from loopd.harness.core import Frozen
from loopd.harness.gate._errors import (
    RulePersistenceError,
    RuleStoreCorruptError,
    RuleStoreError,
)
from loopd.harness.gate._evaluate import GateAnswer, GatePrompt, Rule, RuleEffect

RULES_FILE_NAME: Final = "gate-rules.json"
_MAX_RULES_FILE_BYTES: Final = 4 * 1024 * 1024
_LOCK_POLL_SECONDS: Final = 0.01


@runtime_checkable
class RuleStore(Protocol):
    """Where a workspace's "always" grants (and stored denies) live."""

    async def load(self) -> tuple[Rule, ...]:
        """All stored rules. Raises `RuleStoreError` (fail closed) if they cannot be read."""
        ...

    async def add(self, rules: Sequence[Rule]) -> tuple[Rule, ...]:
        """Store ``rules`` all-or-nothing and return the full new set. Raises `RulePersistenceError`."""
        ...


def merge_rules(existing: Sequence[Rule], added: Sequence[Rule]) -> tuple[Rule, ...]:
    """Existing rules plus new ones, without duplicates; a deny drops an allow with the same kind and pattern."""
    merged: dict[tuple[str, str, RuleEffect], Rule] = {}
    for rule in (*existing, *added):
        merged.setdefault((rule.kind, rule.pattern, rule.effect), rule)
    denied = {r.key for r in merged.values() if r.effect is RuleEffect.DENY}
    return tuple(r for r in merged.values() if r.effect is RuleEffect.DENY or r.key not in denied)


class _RulesFile(Frozen):
    version: Literal[1] = 1
    rules: tuple[Rule, ...] = ()


class MemoryRuleStore:
    """An in-memory twin of `FileRuleStore`, with failure injection for tests."""

    def __init__(self, rules: Sequence[Rule] = (), *, fail_adds: bool = False) -> None:
        self._rules = merge_rules((), rules)
        self._fail_adds = fail_adds
        self.add_calls = 0

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def fail_adds(self, fail: bool = True) -> None:
        """Make every later `add` raise `RulePersistenceError` (and store nothing)."""
        self._fail_adds = fail

    async def load(self) -> tuple[Rule, ...]:
        return self._rules

    async def add(self, rules: Sequence[Rule]) -> tuple[Rule, ...]:
        self.add_calls += 1
        if self._fail_adds:
            raise RulePersistenceError("injected failure: rules not stored")
        self._rules = merge_rules(self._rules, rules)
        return self._rules


class FileRuleStore:
    """Rules in one JSON file per workspace. Every operation is bounded by ``timeout`` seconds."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self._path = Path(path)
        self._timeout = timeout

    @classmethod
    def for_workspace(cls, root: str | os.PathLike[str], *, timeout: float = 5.0) -> FileRuleStore:
        """The conventional location, ``<root>/.loopd/gate-rules.json`` (the file tools refuse to write there)."""
        return cls(Path(root) / ".loopd" / RULES_FILE_NAME, timeout=timeout)

    @property
    def path(self) -> Path:
        return self._path

    async def load(self) -> tuple[Rule, ...]:
        try:
            async with asyncio.timeout(self._timeout):
                return await asyncio.to_thread(self._read)
        except TimeoutError as exc:
            raise RuleStoreError(f"reading {self._path} timed out after {self._timeout}s") from exc

    async def add(self, rules: Sequence[Rule]) -> tuple[Rule, ...]:
        # The lock wait ends before the overall timeout, so a busy lock reports itself as such.
        deadline = time.monotonic() + self._timeout * 0.8
        try:
            async with asyncio.timeout(self._timeout):
                return await asyncio.to_thread(self._add, tuple(rules), deadline)
        except TimeoutError as exc:
            # The worker thread cannot be stopped; if it completes later the rules are stored, but this
            # grant is not minted (fail closed).
            raise RulePersistenceError(f"storing rules in {self._path} timed out after {self._timeout}s") from exc

    # -- blocking helpers, run in a worker thread ---------------------------------------------------------------

    def _read(self) -> tuple[Rule, ...]:
        try:
            with open(self._path, "rb") as f:
                data = f.read(_MAX_RULES_FILE_BYTES + 1)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise RuleStoreError(f"cannot read {self._path}: {exc}") from exc
        if len(data) > _MAX_RULES_FILE_BYTES:
            raise RuleStoreCorruptError(f"{self._path} is larger than {_MAX_RULES_FILE_BYTES} bytes")
        try:
            return _RulesFile.model_validate_json(data).rules
        except ValidationError as exc:
            raise RuleStoreCorruptError(f"{self._path} is not a valid rules file: {exc}") from exc

    def _add(self, rules: tuple[Rule, ...], deadline: float) -> tuple[Rule, ...]:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise RulePersistenceError(f"cannot create {self._path.parent}: {exc}") from exc
        with self._locked(deadline):
            try:
                current = self._read()
            except RuleStoreCorruptError as exc:
                raise RulePersistenceError(f"refusing to overwrite an unreadable rules file: {exc}") from exc
            except RuleStoreError as exc:
                raise RulePersistenceError(str(exc)) from exc
            merged = merge_rules(current, rules)
            body = _RulesFile(rules=merged).model_dump(mode="json")
            payload = (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode()
            self._write_atomically(payload)
            return merged

    @contextlib.contextmanager
    def _locked(self, deadline: float) -> Iterator[None]:
        lock_path = self._path.with_name(self._path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RulePersistenceError(f"cannot open lock {lock_path}: {exc}") from exc
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise RulePersistenceError(f"{lock_path} is held by another writer") from None
                    time.sleep(_LOCK_POLL_SECONDS)
                except OSError as exc:
                    raise RulePersistenceError(f"cannot lock {lock_path}: {exc}") from exc
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_atomically(self, payload: bytes) -> None:
        try:
            write_atomically(self._path, payload)
        except OSError as exc:
            raise RulePersistenceError(f"cannot write {self._path}: {exc}") from exc


class GateResolution(Frozen):
    """The outcome of answering a prompt: whether the gated calls may run, and what was stored."""

    answer: GateAnswer
    granted: bool
    call_ids: tuple[str, ...]
    persisted: tuple[Rule, ...] = ()
    error: str | None = None


async def resolve_answer(prompt: GatePrompt, answer: GateAnswer, store: RuleStore) -> GateResolution:
    """Turn an answer into a grant (or not).

    ``APPROVE_ALWAYS`` stores every grant the prompt showed, atomically, *before* granting; if the store fails
    (`RuleStoreError`) nothing is granted and the resolution says why. Other exceptions propagate — still with
    no grant minted.
    """
    call_ids = prompt.call_ids
    if answer is GateAnswer.DENY:
        return GateResolution(answer=answer, granted=False, call_ids=call_ids)
    if answer is GateAnswer.APPROVE:
        return GateResolution(answer=answer, granted=True, call_ids=call_ids)
    rules = tuple(grant.as_rule() for grant in prompt.grants)
    if rules:
        try:
            await store.add(rules)
        except RuleStoreError as exc:
            return GateResolution(answer=answer, granted=False, call_ids=call_ids, error=str(exc))
    return GateResolution(answer=answer, granted=True, call_ids=call_ids, persisted=rules)
