"""Trivial tools for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
from typing import Any

from loopd.harness._errors import ToolArgumentsError
from loopd.harness.core import EffectKind, Idempotency, ToolCall
from loopd.harness.models import ToolSpec
from loopd.harness.tools._protocol import GrantCandidate, PreparedCall, Requirement, ToolContext, ToolResult


class EchoTool:
    """Returns its ``text`` argument, optionally after ``delay`` seconds. Read-only and idempotent."""

    def __init__(self, name: str = "echo", *, idempotency: Idempotency = Idempotency.INHERENT) -> None:
        self._spec = ToolSpec(
            name=name,
            description="Echo the given text back.",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}, "delay": {"type": "number", "minimum": 0}},
                "required": ["text"],
                "additionalProperties": False,
            },
        )
        self._idempotency = idempotency
        self.runs: list[dict[str, Any]] = []

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def effect(self) -> EffectKind:
        return EffectKind.NONE

    @property
    def idempotency(self) -> Idempotency:
        return self._idempotency

    def prepare(self, call: ToolCall) -> PreparedCall:
        text = call.arguments.get("text")
        if not isinstance(text, str):
            raise ToolArgumentsError("echo needs a string 'text'")
        delay = call.arguments.get("delay", 0)
        if not isinstance(delay, int | float) or delay < 0:
            raise ToolArgumentsError("'delay' must be a non-negative number")
        return PreparedCall(call_id=call.id, tool=self._spec.name, arguments=dict(call.arguments), summary=text[:60])

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        self.runs.append(dict(call.arguments))
        delay = float(call.arguments.get("delay", 0))
        if delay:
            ctx.progress(f"waiting {delay:g}s")
            await asyncio.sleep(delay)
        return ToolResult(output=str(call.arguments["text"]))


class TouchTool:
    """Pretends to write ``path``: needs an ``fs.write`` permission for it, so every call meets the gate. Records
    what it ran in ``ran`` (tests check that nothing ran before an answer)."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            name="touch",
            description="Touch a file (a test double that needs write permission).",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        )

    @property
    def effect(self) -> EffectKind:
        return EffectKind.WRITE

    @property
    def idempotency(self) -> Idempotency:
        return Idempotency.INHERENT

    def prepare(self, call: ToolCall) -> PreparedCall:
        path = call.arguments.get("path")
        if not isinstance(path, str) or not path:
            raise ToolArgumentsError("touch needs a string 'path'")
        requirement = Requirement(
            kind="fs.write",
            scope="/ws",
            match=path,
            description=f"write {path}",
            candidates=(GrantCandidate(kind="fs.write", pattern=path),),
        )
        return PreparedCall(call_id=call.id, tool="touch", arguments=dict(call.arguments), requirements=(requirement,))

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        self.ran.append(str(call.arguments["path"]))
        return ToolResult(output="touched")
