"""Scaffolding shared by the built-in tools: typed arguments, the JSON schema, and blocking work with a timeout.

A built-in tool declares a pydantic model for its arguments. `prepare` validates them (refusing with
`ToolArgumentsError`), normalizes paths and states requirements; `run` validates the prepared arguments again
(they may come back from the journal after a restore) and does the work.
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from loopd.harness._errors import ToolArgumentsError, ToolError
from loopd.harness.core import EffectKind, Idempotency, ToolCall
from loopd.harness.models import ToolSpec
from loopd.harness.tools._protocol import PreparedCall, Requirement, ToolContext, ToolResult
from loopd.harness.tools._workspace import Workspace

BLOCKING_IO_TIMEOUT: Final = 30.0
"""Seconds a tool's filesystem work may take before the call fails."""


class ToolArgs(BaseModel):
    """Base for a tool's argument model: immutable, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


ArgsT = TypeVar("ArgsT", bound=ToolArgs)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plan(Generic[ArgsT]):
    """What `prepare` decided: normalized arguments, requirements and a one-line summary."""

    args: ArgsT
    requirements: tuple[Requirement, ...]
    summary: str


class BuiltinTool(ABC, Generic[ArgsT]):
    """A workspace-confined tool with typed arguments."""

    name: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[ToolArgs]]
    effect_kind: ClassVar[EffectKind]
    idempotency_kind: ClassVar[Idempotency]

    def __init__(self, workspace: Workspace) -> None:
        self._workspace = workspace

    @property
    def workspace(self) -> Workspace:
        return self._workspace

    @property
    def spec(self) -> ToolSpec:
        return _spec_of(type(self))

    @property
    def effect(self) -> EffectKind:
        return self.effect_kind

    @property
    def idempotency(self) -> Idempotency:
        return self.idempotency_kind

    def prepare(self, call: ToolCall) -> PreparedCall:
        plan = self._plan(self._parse(call.arguments))
        return PreparedCall(
            call_id=call.id,
            tool=self.name,
            arguments=plan.args.model_dump(mode="json"),
            requirements=plan.requirements,
            summary=plan.summary,
        )

    async def run(self, call: PreparedCall, ctx: ToolContext) -> ToolResult:
        return await self._run(self._parse(call.arguments), ctx)

    @abstractmethod
    def _plan(self, args: ArgsT) -> Plan[ArgsT]: ...

    @abstractmethod
    async def _run(self, args: ArgsT, ctx: ToolContext) -> ToolResult: ...

    @property
    def _scope(self) -> str:
        return str(self._workspace.root)

    def _parse(self, arguments: dict[str, Any]) -> ArgsT:
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {describe_validation(exc)}") from exc
        return parsed  # type: ignore[return-value]  # args_model is the ArgsT of this subclass


def describe_validation(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(x) for x in error["loc"]) or "arguments"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)


@functools.cache
def _spec_of(tool: type[BuiltinTool[Any]]) -> ToolSpec:
    """A built-in tool's spec depends on its class only: built once per class (it is immutable), not per session."""
    return ToolSpec(name=tool.name, description=tool.description, parameters=json_schema(tool.args_model))


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema without pydantic's "title" noise (property names are kept)."""
    return _strip_titles(model.model_json_schema())  # type: ignore[no-any-return]


def _strip_titles(node: Any, *, in_properties: bool = False) -> Any:
    if isinstance(node, dict):
        return {
            key: _strip_titles(value, in_properties=(key == "properties" and not in_properties))
            for key, value in node.items()
            if in_properties or key != "title"
        }
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


async def run_blocking(func: Callable[[], T], *, timeout: float = BLOCKING_IO_TIMEOUT, what: str) -> T:
    """Run blocking filesystem work in a thread, bounded by ``timeout`` (the thread itself cannot be stopped)."""
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.to_thread(func)
    except TimeoutError as exc:
        raise ToolError(f"{what} timed out after {timeout:g}s") from exc


def truncate_middle(text: str, limit: int, *, unit: str = "characters") -> str:
    """Keep the head and tail of ``text`` within ``limit``, with a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[… {omitted} {unit} omitted …]\n{text[len(text) - half :]}"
