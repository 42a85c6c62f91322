"""A loop actor's spans: ``invoke_agent`` per turn, ``chat`` per model call, ``execute_tool`` per tool call.

Only built when tracing is on (`loopd._infra.telemetry.tracing_enabled`); a loop actor without one records nothing
and pays nothing. A turn's span continues the trace of the input that started it: the context current when the
input was submitted (the engine's drive, or ``loopd harness serve``'s request with its ``traceparent``) is
remembered by command id and used as the parent when the journaled `TurnStarted` names that input. Model and tool
effects run inside their own span, a child of their turn's. Spans are not journaled: a turn resumed after a restart
gets a new ``invoke_agent`` span in whatever trace its resumer runs in.

Must not do: change what the loop decides or journals.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace

from loopd._infra.telemetry import Span, SpanKind, mark_failed, tracer
from loopd.harness.core import ToolCall, ToolOutcome, Usage
from loopd.harness.core.events import LoopEvent, TurnDone, TurnFailed, TurnInterrupted, TurnStarted
from loopd.harness.core.inputs import ModelCompleted, ModelFailed

_REMEMBERED_INPUTS: Final = 64
_TURN_BOUNDARIES: Final = frozenset({TurnStarted, TurnDone, TurnFailed, TurnInterrupted})


async def _run_in(span: Span, work: Coroutine[Any, Any, None]) -> None:
    """Await ``work`` with ``span`` current, then end the span; an exception marks it failed on the way out.

    What the SDK's ``start_as_current_span`` does, without its two generator-based context managers (a chat and a
    tool span per step: the wrappers were a quarter of a span's cost)."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        await work
    except Exception as exc:
        if span.is_recording():
            span.record_exception(exc)
            mark_failed(span, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        otel_context.detach(token)
        span.end()


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    return {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
        "loopd.usage.cost_usd": usage.cost_usd,
    }


class LoopTracing:
    """The spans of one loop actor (see the module docstring)."""

    def __init__(self, *, session_id: str, loop: str, model: str) -> None:
        self._tracer = tracer("loopd.harness")
        self._session_id = session_id
        self._loop = loop
        self._model = model
        self._inputs: OrderedDict[str, otel_context.Context] = OrderedDict()
        self._turns: dict[str, tuple[Span, otel_context.Context]] = {}  # a turn's span, and a context naming it

    def remember_input(self, command_id: str) -> None:
        """Note the current context as the parent of the turn this input will start (or join)."""
        if not trace.get_current_span().get_span_context().is_valid:
            return
        self._inputs[command_id] = otel_context.get_current()
        while len(self._inputs) > _REMEMBERED_INPUTS:
            self._inputs.popitem(last=False)

    def observe(self, event: LoopEvent) -> None:
        """Open a turn's span at `TurnStarted`; close it at the turn's terminal event."""
        if type(event) not in _TURN_BOUNDARIES:
            return  # most events (every step's) concern no turn span: one set lookup, not four pattern tests
        match event:
            case TurnStarted(turn_id=turn_id, inputs=inputs):
                parent = None
                for queued in inputs:
                    parent = self._inputs.pop(queued.command_id, None) or parent
                span = self._tracer.start_span(
                    f"invoke_agent {self._loop}",
                    context=parent,
                    kind=SpanKind.INTERNAL,
                    attributes={
                        "gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": self._loop,
                        "gen_ai.conversation.id": self._session_id,
                        "gen_ai.request.model": self._model,
                        "loopd.turn.id": turn_id,
                    },
                )
                self._turns[turn_id] = (span, trace.set_span_in_context(span))
            case TurnDone(turn_id=turn_id, usage=usage):
                self._end_turn(turn_id, usage, None)
            case TurnFailed(turn_id=turn_id, usage=usage, error_type=error_type):
                self._end_turn(turn_id, usage, error_type)
            case TurnInterrupted(turn_id=turn_id, usage=usage, reason=reason):
                self._end_turn(turn_id, usage, None, interrupted=reason)
            case _:
                pass

    def _end_turn(self, turn_id: str, usage: Usage, error: str | None, *, interrupted: str | None = None) -> None:
        opened = self._turns.pop(turn_id, None)
        if opened is None:
            return
        span = opened[0]
        span.set_attributes(_usage_attributes(usage))
        if interrupted is not None:
            span.set_attribute("loopd.turn.interrupted", interrupted)
        if error is not None:
            span.set_attribute("error.type", error)
            mark_failed(span, error)
        span.end()

    def _turn_context(self, turn_id: str) -> otel_context.Context | None:
        opened = self._turns.get(turn_id)
        return opened[1] if opened is not None else None

    def model_call(self, turn_id: str, model: str, work: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
        """``work`` (a model effect) run inside a ``chat {model}`` span, which starts now (the effect reports its
        result with `model_result`)."""
        span = self._tracer.start_span(
            f"chat {model}",
            context=self._turn_context(turn_id),
            kind=SpanKind.CLIENT,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model},
        )
        return _run_in(span, work)

    @staticmethod
    def model_result(result: ModelCompleted | ModelFailed) -> None:
        """Record a model call's outcome on the current ``chat`` span."""
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes = _usage_attributes(result.usage)  # one `set_attributes`: the SDK cleans and locks per call
        if isinstance(result, ModelFailed):
            attributes["error.type"] = result.error_type
            span.set_attributes(attributes)
            mark_failed(span, result.error_type)
        else:
            attributes["gen_ai.response.finish_reasons"] = ("tool_calls" if result.tool_calls else "stop",)
            span.set_attributes(attributes)

    def tool_call(self, turn_id: str, call: ToolCall, work: Coroutine[Any, Any, None]) -> Coroutine[Any, Any, None]:
        """``work`` (a tool effect) run inside an ``execute_tool {name}`` span, which starts now."""
        span = self._tracer.start_span(
            f"execute_tool {call.name}",
            context=self._turn_context(turn_id),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "function",
            },
        )
        return _run_in(span, work)

    def foreign_tool(self, call_id: str, name: str) -> Span:
        """An ``execute_tool {name}`` span for a foreign CLI's own tool, a child of the current span (the foreign
        turn's ``chat`` span), started when the CLI reports the use; the caller ends it (`foreign_tool_end`)."""
        return self._tracer.start_span(
            f"execute_tool {name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "extension",
            },
        )

    @staticmethod
    def foreign_tool_end(span: Span, *, is_error: bool | None) -> None:
        """End a foreign tool's span: failed when the CLI reported an error, unfinished when no result came."""
        if is_error is None:
            span.set_attribute("loopd.tool.unfinished", True)
        elif is_error:
            span.set_attribute("error.type", "tool_error")
            mark_failed(span, "tool_error")
        span.end()

    @staticmethod
    def tool_result(outcome: ToolOutcome) -> None:
        """Record a tool call's outcome on the current ``execute_tool`` span."""
        span = trace.get_current_span()
        if span.is_recording() and outcome.status == "error":
            span.set_attribute("error.type", "tool_error")
            mark_failed(span, "tool_error")

    def close(self) -> None:
        """End the spans of turns still open (the actor stops or is aborted)."""
        for span, _ in self._turns.values():
            span.set_attribute("loopd.turn.unfinished", True)
            span.end()
        self._turns.clear()
        self._inputs.clear()
