"""Model seam and implementations."""

from loopd.harness.models._config import DEMO_MODEL, ModelConfig, build_model, open_model
from loopd.harness.models._openai import Backoff, OpenAICompatibleModel
from loopd.harness.models._pricing import CostQuote, ModelPrice, PriceTable, PriceTableError
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
from loopd.harness.models._scripted_server import (
    DemoOptions,
    DropAfter,
    FailWithStatus,
    IncomingRequest,
    ScriptedServer,
    ServerReply,
    ServerStatistics,
    ServerToolCall,
    demo_reply,
    open_scripted_server,
)

__all__ = [
    "DEMO_MODEL",
    "Backoff",
    "CostQuote",
    "DemoOptions",
    "DropAfter",
    "FailWithStatus",
    "IncomingRequest",
    "Model",
    "ModelChunk",
    "ModelConfig",
    "ModelPrice",
    "ModelReply",
    "ModelRequest",
    "OpenAICompatibleModel",
    "PriceTable",
    "PriceTableError",
    "Reply",
    "ScriptedModel",
    "ScriptedServer",
    "ServerReply",
    "ServerStatistics",
    "ServerToolCall",
    "TextDelta",
    "ToolCallDelta",
    "ToolSpec",
    "UsageReport",
    "build_model",
    "demo_reply",
    "open_model",
    "open_scripted_server",
    "tool_calls_from_deltas",
]
