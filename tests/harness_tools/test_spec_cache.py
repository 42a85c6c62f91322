"""The tool-spec cache docs/BENCHMARKS.md claims ("tool specs built once per tool class instead of per session").

A session start used to rebuild every tool's JSON schema (pydantic ``model_json_schema``) — ≈ 9 ms of blocked loop
per start and ~17 KiB per idle session. These tests fail when a spec is built again for a new instance (a new
session's tools) instead of coming from the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from loopd.harness.actors import _delegation
from loopd.harness.actors._delegation import ListAgentsTool, StartAgentTool
from loopd.harness.tools._ask import AskUserTool
from loopd.harness.tools._files import ReadFileTool, WriteFileTool
from loopd.harness.tools._workspace import Workspace


def test_a_builtin_tools_spec_is_built_once_per_class_not_per_instance(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = ReadFileTool(Workspace(tmp_path / "a")), ReadFileTool(Workspace(tmp_path / "b"))
    assert first.spec is second.spec  # the same object: not rebuilt for a new instance (a new session's tools)
    assert first.spec is first.spec  # nor on every access
    assert WriteFileTool(Workspace(tmp_path / "a")).spec is not first.spec  # per class


def test_delegation_tool_specs_are_built_once_per_set_of_agent_definitions(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    original = _delegation.StartAgentTool.args.model_json_schema

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append("start_agent")
        return original(*args, **kwargs)

    _delegation._spec_of.cache_clear()
    monkeypatch.setattr(_delegation.StartAgentTool.args, "model_json_schema", counting)
    session = cast(Any, object())  # the spec does not depend on the session: that is the point
    one = StartAgentTool(session, "main", ("researcher", "writer"))
    two = StartAgentTool(session, "other", ("researcher", "writer"))
    assert one.spec is two.spec and built == ["start_agent"]
    assert one.spec.parameters["properties"]["agent"]["enum"] == ["researcher", "writer"]
    other = StartAgentTool(session, "main", ("critic",))
    assert other.spec is not one.spec and other.spec.parameters["properties"]["agent"]["enum"] == ["critic"]
    assert ListAgentsTool(session, "a", ()).spec is ListAgentsTool(session, "b", ()).spec


def test_the_ask_user_spec_is_built_once_not_per_session() -> None:
    """Every chat's session offers ask_user: its spec (a JSON schema) comes from the cache."""
    first, second = AskUserTool(), AskUserTool(timeout=5)
    assert first.spec is second.spec and first.spec is first.spec
    assert first.spec.name == "ask_user" and "question" in first.spec.parameters["properties"]
