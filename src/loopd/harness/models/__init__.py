"""Model seam and implementations.

The OpenAI adapter and the scripted OpenAI-compatible server are loaded on first use: the ``openai`` client and the
ASGI stack take ~0.5 s to import, which every CLI start would otherwise pay.
"""

from typing import TYPE_CHECKING, Any

from loopd.harness.models._cassette import (
    REPLAY_API_KEY,
    Cassette,
    CassetteError,
    CassetteMismatchError,
    CassetteMode,
    CassetteSettings,
    CassetteStatistics,
    CassetteTiming,
    open_cassette,
)
from loopd.harness.models._config import DEMO_MODEL, PROVIDERS, ModelConfig, ModelTarget, build_model, open_model
from loopd.harness.models._fallback import ChainEntry, FallbackModel, ProviderModel
from loopd.harness.models._pricing import CostQuote, ModelPrice, PriceTable, PriceTableError
from loopd.harness.models._protocol import (
    AttemptFailed,
    Model,
    ModelChunk,
    ModelReply,
    ModelRequest,
    ReplyInfo,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageReport,
    tool_calls_from_deltas,
)
from loopd.harness.models._ratelimit import RateLimit, RateLimiter, RateLimitQueueFull
from loopd.harness.models._recording import (
    ModelAttemptRecord,
    ModelCallLog,
    ModelCallRecord,
    Pacer,
    RecordingModel,
    pace_whole_replies,
    record_model_calls,
    recording,
)
from loopd.harness.models._scripted import Reply, ScriptedModel

if TYPE_CHECKING:
    from loopd.harness.models._anthropic import AnthropicModel
    from loopd.harness.models._anthropic_server import (
        AnthropicReply,
        AnthropicRequest,
        AnthropicScriptedServer,
        open_anthropic_server,
    )
    from loopd.harness.models._openai import OpenAICompatibleModel
    from loopd.harness.models._scripted_server import (
        TOOL_RESULTS_HEADER,
        DemoOptions,
        DemoRule,
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

_LAZY = {
    "AnthropicModel": "_anthropic",
    "AnthropicReply": "_anthropic_server",
    "AnthropicRequest": "_anthropic_server",
    "AnthropicScriptedServer": "_anthropic_server",
    "open_anthropic_server": "_anthropic_server",
    "OpenAICompatibleModel": "_openai",
    "DemoOptions": "_scripted_server",
    "DemoRule": "_scripted_server",
    "DropAfter": "_scripted_server",
    "FailWithStatus": "_scripted_server",
    "IncomingRequest": "_scripted_server",
    "ScriptedServer": "_scripted_server",
    "ServerReply": "_scripted_server",
    "ServerStatistics": "_scripted_server",
    "ServerToolCall": "_scripted_server",
    "TOOL_RESULTS_HEADER": "_scripted_server",
    "demo_reply": "_scripted_server",
    "open_scripted_server": "_scripted_server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "DEMO_MODEL",
    "PROVIDERS",
    "REPLAY_API_KEY",
    "TOOL_RESULTS_HEADER",
    "AnthropicModel",
    "AnthropicReply",
    "AnthropicRequest",
    "AnthropicScriptedServer",
    "AttemptFailed",
    "Cassette",
    "CassetteError",
    "CassetteMismatchError",
    "CassetteMode",
    "CassetteSettings",
    "CassetteStatistics",
    "CassetteTiming",
    "ChainEntry",
    "CostQuote",
    "DemoOptions",
    "DemoRule",
    "DropAfter",
    "FailWithStatus",
    "FallbackModel",
    "IncomingRequest",
    "Model",
    "ModelAttemptRecord",
    "ModelCallLog",
    "ModelCallRecord",
    "ModelChunk",
    "ModelConfig",
    "ModelPrice",
    "ModelReply",
    "ModelRequest",
    "ModelTarget",
    "OpenAICompatibleModel",
    "Pacer",
    "PriceTable",
    "PriceTableError",
    "ProviderModel",
    "RateLimit",
    "RateLimitQueueFull",
    "RateLimiter",
    "RecordingModel",
    "Reply",
    "ReplyInfo",
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
    "open_anthropic_server",
    "open_cassette",
    "open_model",
    "open_scripted_server",
    "pace_whole_replies",
    "record_model_calls",
    "recording",
    "tool_calls_from_deltas",
]
