"""Gate tests: the pure evaluator, answers, rule stores and policy files. Property tests are derandomized."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.harness.gate import FileRuleStore


@pytest.fixture
def rules_path(tmp_path: Path) -> Path:
    return tmp_path / "ws" / ".loopd" / "gate-rules.json"


@pytest.fixture
def file_store(rules_path: Path) -> FileRuleStore:
    return FileRuleStore(rules_path, timeout=5)
