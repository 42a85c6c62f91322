"""Foreign loops (issue 17.5): a loop whose engine is an external coding-agent CLI (`claude -p --output-format
stream-json`, `codex exec --json`) run as a subprocess per turn. `ForeignEngine` is given as the loop's model; the
pure parsers map the CLIs' JSON lines onto one neutral vocabulary; `run_foreign_turn` runs one turn. See
docs/foreign-loops.md."""

from loopd.harness.foreign._engine import (
    ENGINE_KEYS,
    SAFE_ENVIRONMENT,
    ForeignEngine,
    ForeignEngineError,
    ForeignKind,
    PermissionDecider,
    foreign_environment,
    plain_session_id,
    run_foreign_turn,
    standard_engine,
)
from loopd.harness.foreign._protocols import (
    Finished,
    ForeignEvent,
    ForeignProtocolError,
    PermissionRequest,
    SessionBound,
    TextPiece,
    ToolResult,
    ToolUse,
    claude_permission_reply,
    claude_user_line,
    parse_claude_line,
    parse_codex_line,
)

__all__ = [
    "ENGINE_KEYS",
    "SAFE_ENVIRONMENT",
    "Finished",
    "ForeignEngine",
    "ForeignEngineError",
    "ForeignEvent",
    "ForeignKind",
    "ForeignProtocolError",
    "PermissionDecider",
    "PermissionRequest",
    "SessionBound",
    "TextPiece",
    "ToolResult",
    "ToolUse",
    "claude_permission_reply",
    "claude_user_line",
    "foreign_environment",
    "parse_claude_line",
    "parse_codex_line",
    "plain_session_id",
    "run_foreign_turn",
    "standard_engine",
]
