"""Model seam and implementations."""

from loopd.harness.models._protocol import (
    Model,
    ModelChunk,
    ModelReply,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageReport,
    tool_calls_from_deltas,
)
from loopd.harness.models._scripted import Reply, ScriptedModel

__all__ = [
    "Model",
    "ModelChunk",
    "ModelReply",
    "ModelRequest",
    "Reply",
    "ScriptedModel",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "UsageReport",
    "tool_calls_from_deltas",
]
