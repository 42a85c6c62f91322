"""The event streams of external coding-agent CLIs, read line by line into one neutral vocabulary (pure).

Two protocols, one JSON object per line on the CLI's stdout:

* ``claude -p --output-format stream-json --verbose`` — ``{"type": "system", "subtype": "init", "session_id"}``
  first; then ``assistant`` messages whose ``message.content`` holds ``text`` and ``tool_use`` blocks, ``user``
  messages holding ``tool_result`` blocks, and a final ``result`` (``subtype`` success or an error, ``result``
  text, ``usage``, ``is_error``). A later turn resumes with ``--resume <session_id>``.
* ``codex exec --json`` — ``thread.started`` (``thread_id``), ``turn.started``, ``item.started`` /
  ``item.updated`` / ``item.completed`` (``item.type``: agent_message, reasoning, command_execution,
  file_change, mcp_tool_call, web_search, todo_list, error), ``turn.completed`` (``usage``) or ``turn.failed``
  (``error.message``), and top-level ``error``. A later turn resumes with ``codex exec resume <thread_id>``.

`parse_claude_line` / `parse_codex_line` map one line to zero or more `ForeignEvent` values: `SessionBound` (the
late-bound foreign session id), `TextPiece`, `ToolUse`, `ToolResult`, `Finished`. Unknown types are skipped (the
CLIs add event types over time); a line that is not a JSON object is `ForeignProtocolError`.

With ``--permission-prompt-tool stdio`` (and ``--input-format stream-json``: the prompt and the answers go to the
CLI's stdin), claude asks before each tool it may not use on its own: a ``control_request`` line (``request.subtype``
``can_use_tool``: ``tool_name``, ``input``, ``tool_use_id``) becomes `PermissionRequest`; `claude_permission_reply`
is the ``control_response`` line that answers it. ``codex exec`` asks nothing (it runs under its own sandbox and
approval flags). The subprocess engine is `loopd.harness.foreign._engine`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from loopd.harness._errors import HarnessError


class ForeignProtocolError(HarnessError):
    """A line of a foreign CLI's stream is not a JSON object."""


@dataclass(frozen=True, slots=True)
class SessionBound:
    """The CLI named its own session (thread) id: record it to resume the conversation later."""

    session_id: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The foreign agent started a tool of its own (a command, a file change, an MCP call)."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """The foreign turn ended: ``text`` its final answer, ``error`` set when it failed."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    cached_tokens: int = 0
    """Input tokens read from the provider's prompt cache (claude ``cache_read_input_tokens``, codex
    ``cached_input_tokens``)."""
    cost_usd: float = 0.0
    """What the CLI says the turn cost (claude's ``total_cost_usd``; codex reports none)."""


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    """The foreign agent asks whether it may run ``tool`` with ``arguments`` (answer with `request_id`)."""

    request_id: str
    tool: str
    arguments: dict[str, Any]
    call_id: str = ""


ForeignEvent = SessionBound | TextPiece | ToolUse | ToolResult | Finished | PermissionRequest


def _object(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise ForeignProtocolError(f"not JSON: {line[:120]!r}") from exc
    if not isinstance(data, dict):
        raise ForeignProtocolError(f"not a JSON object: {line[:120]!r}")
    return data


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _count(value: Any) -> int:
    """A token count a CLI reported (anything that is not a non-negative integer counts 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _cost(value: Any) -> float:
    """A cost in USD a CLI reported (anything that is not a finite non-negative number counts 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    cost = float(value)
    return cost if math.isfinite(cost) and cost >= 0 else 0.0


def parse_claude_line(line: str) -> list[ForeignEvent]:
    """The neutral events of one line of ``claude -p --output-format stream-json``."""
    data = _object(line)
    if data is None:
        return []
    kind = data.get("type")
    out: list[ForeignEvent] = []
    if kind == "system" and data.get("subtype") == "init" and isinstance(data.get("session_id"), str):
        out.append(SessionBound(data["session_id"]))
    elif kind in ("assistant", "user"):
        message = data.get("message") or {}
        for block in message.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and kind == "assistant":
                out.append(TextPiece(str(block.get("text", ""))))
            elif block.get("type") == "tool_use":
                args = block.get("input")
                out.append(
                    ToolUse(
                        str(block.get("id", "")), str(block.get("name", "")), args if isinstance(args, dict) else {}
                    )
                )
            elif block.get("type") == "tool_result":
                out.append(
                    ToolResult(
                        str(block.get("tool_use_id", "")), _text_of(block.get("content")), bool(block.get("is_error"))
                    )
                )
    elif kind == "control_request":
        request = data.get("request") or {}
        if isinstance(request, dict) and request.get("subtype") == "can_use_tool":
            args = request.get("input")
            out.append(
                PermissionRequest(
                    request_id=str(data.get("request_id", "")),
                    tool=str(request.get("tool_name", "")),
                    arguments=args if isinstance(args, dict) else {},
                    call_id=str(request.get("tool_use_id") or ""),
                )
            )
    elif kind == "result":
        usage = data.get("usage") or {}
        failed = bool(data.get("is_error")) or data.get("subtype") not in (None, "success")
        out.append(
            Finished(
                text=str(data.get("result") or ""),
                input_tokens=int(usage.get("input_tokens") or 0),
                output_tokens=int(usage.get("output_tokens") or 0),
                error=str(data.get("result") or data.get("subtype") or "failed") if failed else None,
                cached_tokens=_count(usage.get("cache_read_input_tokens")),
                cost_usd=_cost(data.get("total_cost_usd")),
            )
        )
    return out


def claude_permission_reply(request: PermissionRequest, *, allow: bool, message: str = "") -> str:
    """The ``control_response`` line (with its newline) that answers ``request`` on claude's stdin."""
    answer: dict[str, Any] = (
        {"behavior": "allow", "updatedInput": request.arguments}
        if allow
        else {"behavior": "deny", "message": message or "denied"}
    )
    body = {"subtype": "success", "request_id": request.request_id, "response": answer}
    return json.dumps({"type": "control_response", "response": body}) + "\n"


def claude_user_line(text: str) -> str:
    """The stream-json ``user`` message line (with its newline) that gives claude its prompt on stdin."""
    return json.dumps({"type": "user", "message": {"role": "user", "content": text}}) + "\n"


_CODEX_TOOL_ITEMS = {
    "command_execution": "command",
    "file_change": "file_change",
    "mcp_tool_call": "mcp",
    "web_search": "web_search",
}


def parse_codex_line(line: str) -> list[ForeignEvent]:
    """The neutral events of one line of ``codex exec --json``."""
    data = _object(line)
    if data is None:
        return []
    kind = data.get("type")
    if kind == "thread.started" and isinstance(data.get("thread_id"), str):
        return [SessionBound(data["thread_id"])]
    if kind in ("item.started", "item.completed"):
        item = data.get("item") or {}
        item_type = item.get("type")
        call_id = str(item.get("id", ""))
        if item_type == "agent_message" and kind == "item.completed":
            return [TextPiece(str(item.get("text", "")))]
        if item_type in _CODEX_TOOL_ITEMS:
            if kind == "item.started":
                args = {k: v for k, v in item.items() if k not in ("id", "type", "status", "aggregated_output")}
                return [ToolUse(call_id, _CODEX_TOOL_ITEMS[item_type], args)]
            failed = item.get("status") == "failed" or (item.get("exit_code") not in (None, 0))
            output = item.get("aggregated_output") or item.get("result") or item.get("status") or ""
            return [ToolResult(call_id, str(output), failed)]
        return []
    if kind == "turn.completed":
        usage = data.get("usage") or {}
        tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        return [Finished("", tokens_in, tokens_out, cached_tokens=_count(usage.get("cached_input_tokens")))]
    if kind == "turn.failed":
        return [Finished("", error=str((data.get("error") or {}).get("message") or "the turn failed"))]
    if kind == "error":
        return [Finished("", error=str(data.get("message") or "error"))]
    return []
