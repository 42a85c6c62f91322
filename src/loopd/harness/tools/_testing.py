"""Trivial tools for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
from typing import Any

from loopd.harness._errors import ToolArgumentsError
from loopd.harness.core._values import EffectKind, Idempotency, ToolCall
from loopd.harness.models._protocol import ToolSpec
from loopd.harness.tools._protocol import PreparedCall, ToolContext, ToolResult


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
