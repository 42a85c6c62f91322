"""Shared helpers for the AgentUE tests: fixture loading and small builders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopd.agentue import Model, StreamState

DATA = Path(__file__).resolve().parent.parent / "data" / "agentue"


def load_fixture(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def initial_state(initial: dict[str, Any]) -> StreamState:
    """The conformance files write "no model yet" as `{}`."""
    return StreamState() if not initial else StreamState.of(initial)


def chat_model(*blocks: dict[str, Any], version: str = "1.1", **meta: Any) -> Model:
    return Model.from_json({"version": version, "biz": "chat", "meta": dict(meta), "blocks": list(blocks)})


def text(block_id: str, content: str = "") -> dict[str, Any]:
    return {"id": block_id, "type": "text", "content": content}
