"""Foreign loops (issue 17.5, in progress): the event streams of external coding-agent CLIs (`claude -p
--output-format stream-json`, `codex exec --json`) parsed into a neutral vocabulary. Only the pure parsers exist."""

from loopd.harness.foreign._protocols import (
    Finished,
    ForeignEvent,
    ForeignProtocolError,
    SessionBound,
    TextPiece,
    ToolResult,
    ToolUse,
    parse_claude_line,
    parse_codex_line,
)

__all__ = [
    "Finished",
    "ForeignEvent",
    "ForeignProtocolError",
    "SessionBound",
    "TextPiece",
    "ToolResult",
    "ToolUse",
    "parse_claude_line",
    "parse_codex_line",
]
