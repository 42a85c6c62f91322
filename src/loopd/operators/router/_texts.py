"""The text of a model or a call result (pure): what the Router reads from a harness call as evidence.

A harness call's result is ``{"format": "text" | "json", "content": …}``. An AgentUE model's text prefers its block
with id ``answer``; otherwise it joins the content of its text blocks (and of text ``result`` blocks) with blank
lines. A string is its own text.

Must not do: I/O of any kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["ANSWER_BLOCK", "model_text", "result_text"]

ANSWER_BLOCK: Final = "answer"


def model_text(model: Mapping[str, Any] | None) -> str:
    """The text of an AgentUE model (as JSON): its ``answer`` block, else its text blocks joined."""
    if not model:
        return ""
    blocks = [b for b in model.get("blocks") or () if isinstance(b, Mapping)]
    for block in blocks:
        if block.get("id") == ANSWER_BLOCK and isinstance(block.get("content"), str):
            return str(block["content"])
    texts = [
        str(b["content"])
        for b in blocks
        if isinstance(b.get("content"), str)
        and (b.get("type") == "text" or (b.get("type") == "result" and b.get("format") == "text"))
    ]
    return "\n\n".join(t for t in texts if t)


def result_text(value: object) -> str:
    """The text of a harness call's result: ``{"format", "content"}`` (loop-server's call result) whose content is a
    string or an AgentUE model, an AgentUE model, or a string; anything else has no text."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if "blocks" in value:
            return model_text(value)
        content = value.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Mapping):
            return result_text(content)
    return ""
