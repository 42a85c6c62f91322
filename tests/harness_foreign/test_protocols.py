"""The foreign CLIs' stream lines → neutral events (pure)."""

from __future__ import annotations

import json

import pytest

from loopd.harness.foreign import (
    Finished,
    ForeignProtocolError,
    SessionBound,
    TextPiece,
    ToolResult,
    ToolUse,
    parse_claude_line,
    parse_codex_line,
)

CLAUDE = [
    {"type": "system", "subtype": "init", "session_id": "c-123", "tools": ["Bash"], "model": "m"},
    {
        "type": "assistant",
        "session_id": "c-123",
        "message": {
            "content": [
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ]
        },
    },
    {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}},
    {
        "type": "result",
        "subtype": "success",
        "result": "One file.",
        "is_error": False,
        "session_id": "c-123",
        "usage": {"input_tokens": 10, "output_tokens": 4},
    },
]
CODEX = [
    {"type": "thread.started", "thread_id": "x-9"},
    {"type": "turn.started"},
    {
        "type": "item.started",
        "item": {"id": "i1", "type": "command_execution", "command": "ls", "status": "in_progress"},
    },
    {
        "type": "item.completed",
        "item": {
            "id": "i1",
            "type": "command_execution",
            "command": "ls",
            "aggregated_output": "a.txt\n",
            "exit_code": 0,
            "status": "completed",
        },
    },
    {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "One file."}},
    {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 4}},
]


def _all(parse, lines):  # type: ignore[no-untyped-def]
    return [e for line in lines for e in parse(json.dumps(line))]


def test_claude_stream_json_maps_onto_neutral_events() -> None:
    assert _all(parse_claude_line, CLAUDE) == [
        SessionBound("c-123"),
        TextPiece("Listing."),
        ToolUse("t1", "Bash", {"command": "ls"}),
        ToolResult("t1", "a.txt"),
        Finished("One file.", 10, 4),
    ]
    failed = parse_claude_line(json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True}))
    assert isinstance(failed[0], Finished) and failed[0].error == "error_max_turns"


def test_codex_exec_json_maps_onto_neutral_events() -> None:
    assert _all(parse_codex_line, CODEX) == [
        SessionBound("x-9"),
        ToolUse("i1", "command", {"command": "ls"}),
        ToolResult("i1", "a.txt\n", False),
        TextPiece("One file."),
        Finished("", 10, 4),
    ]
    assert parse_codex_line(json.dumps({"type": "turn.failed", "error": {"message": "quota"}})) == [
        Finished("", error="quota")
    ]


def test_unknown_types_are_skipped_and_non_json_is_a_typed_error() -> None:
    assert parse_claude_line('{"type": "stream_event"}') == [] and parse_codex_line("") == []
    with pytest.raises(ForeignProtocolError):
        parse_codex_line("not json")
    with pytest.raises(ForeignProtocolError):
        parse_claude_line("[1, 2]")


def test_reported_cost_and_cache_reads_are_kept_and_bad_values_count_zero() -> None:
    line = {"type": "result", "subtype": "success", "result": "ok", "total_cost_usd": 0.0042}
    line["usage"] = {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 7}
    (done,) = parse_claude_line(json.dumps(line))
    assert done == Finished("ok", 10, 4, cached_tokens=7, cost_usd=0.0042)
    for bad in (-1, "1.5", True, None, float("inf")):
        line["total_cost_usd"] = bad
        line["usage"] = {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": bad}
        (done,) = parse_claude_line(json.dumps(line))
        assert (done.cost_usd, done.cached_tokens) == (0.0, 0)
    codex = {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 6, "output_tokens": 4}}
    assert parse_codex_line(json.dumps(codex)) == [Finished("", 10, 4, cached_tokens=6)]
