"""The standard harness: the rig that `loopd run`, `loopd harness serve` and loop-server's built-in harness share.

One loop (``main``) with the configured model, the workspace-confined built-in tools, the gate (configured access
from a headless policy + stored rules in ``<workspace>/.loopd/gate-rules.json``), pricing from the model's price
table, an optional budget, compaction past ``compact_at_tokens``, a ``helper`` subagent definition the main loop
may delegate to (same tools and gate, depth 1), and a SQLite journal in the data directory. Open it with
`open_standard_rig`; it closes the journal and the model (and the demo model's in-process server) on exit.

bash runs its commands in the configured sandbox (default: ``$LOOPD_SANDBOX``, else bubblewrap when it works
here), which hides the data directory, loopd's default data directory (where `loopd up` keeps its credentials)
and every other ``hidden`` directory from them, even inside the workspace (e.g. `loopd run` in the home directory).

`WorkspaceRigs` (from `workspace_rigs`) derives, from an open standard rig, a rig for one directory under a
workspaces root and one tools profile (`ToolsProfile`: ``none`` no tools, ``read`` read_file/list_dir/glob/grep,
``write`` those plus write_file/edit_file/bash). Such a rig is for calls nobody attends (an operator's harness call):
its gate allows, by configuration, what the profile offers inside its workspace — file reads, file writes, and bash
only when the sandbox confines commands (elsewhere bash asks, like any gate) — and it has no helper subagent.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TextIO

from loopd._infra.clock import Clock, SystemClock
from loopd._paths import default_data_dir, ensure_private_dir
from loopd.harness._errors import HarnessError
from loopd.harness.actors import UNLIMITED, Budget, LoopDefinition, Rig
from loopd.harness.core import Usage
from loopd.harness.core.config import BUILD, PLAN, LoopMode
from loopd.harness.foreign import ForeignEngine
from loopd.harness.gate import DEFAULT_POLICY, GATE_TIMEOUT_DEFAULT, Access, AccessConfig, FileRuleStore, GatePolicy
from loopd.harness.journal import Journal, SqliteJournal
from loopd.harness.models import ModelConfig, PriceTable, open_model
from loopd.harness.snapshots import SnapshotPolicy, SnapshotTrigger
from loopd.harness.tools import (
    EXEC,
    FS_READ,
    FS_WRITE,
    AskUserTool,
    Sandbox,
    Tool,
    Workspace,
    default_tools,
    resolve_sandbox,
)

if TYPE_CHECKING:
    from loopd.harness.models import DemoOptions, DemoRule
    from loopd.harness.tools import McpServer

_log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "FOREIGN_TURN_TIMEOUT",
    "HELPER_AGENT",
    "JOURNAL_FILE",
    "MAIN_LOOP",
    "READ_TOOLS",
    "TOOLS_PROFILES",
    "WRITE_TOOLS",
    "HarnessSettings",
    "ToolsProfile",
    "WorkspaceLocationError",
    "WorkspaceRigs",
    "check_workspace_location",
    "default_data_dir",
    "open_standard_rig",
    "profile_access",
    "rig_on",
    "workspace_rigs",
]

JOURNAL_FILE: Final = "journal.db"
FOREIGN_TURN_TIMEOUT: Final = 3600.0
"""Seconds one turn of a foreign engine may take (a coding agent's turn can be long)."""
MAIN_LOOP: Final = "main"

HELPER_AGENT: Final = "helper"
HELPER_PROMPT: Final = (
    "You are a helper agent started by another agent for one focused task in the same workspace. Do the task with "
    "the tools, then answer with a short, complete report of what you found or changed."
)

DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a careful coding assistant working inside one workspace directory. Use the tools to look before you "
    "change anything, keep changes small, and say plainly what you did. Paths are relative to the workspace."
)


STANDARD_MODES: Final = (BUILD, PLAN)
"""The main loop's modes: ``build`` (every tool; the default) and ``plan`` (read-only tools only)."""


@dataclass(frozen=True)
class HarnessSettings:
    """Everything the standard rig is built from. Paths are created when missing."""

    workspace: Path
    data_dir: Path
    model: ModelConfig = field(default_factory=ModelConfig)
    policy: GatePolicy = DEFAULT_POLICY
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_steps: int = 50
    gate_timeout: float = GATE_TIMEOUT_DEFAULT
    tool_timeout: float = 600.0
    budget: Budget = UNLIMITED
    compact_at_tokens: int | None = 100_000
    max_agents: int = 4
    journal_dsn: str | None = None
    """A PostgreSQL DSN for the journal (so another replica can resume a session); default: SQLite in data_dir."""
    name: str = "loopd"
    sandbox: Sandbox | None = None
    """Where bash runs its commands; None: `resolve_sandbox()` (``$LOOPD_SANDBOX``, default ``auto``)."""
    hidden: tuple[Path, ...] = ()
    """Directories bash must not see besides ``data_dir`` (e.g. the server's data directory holding credentials)."""
    demo_rules: tuple[DemoRule, ...] = ()
    """Extra reply rules for the demo model (``model`` = ``demo``), tried before its own: how a layer above the
    harness (e.g. the Router's ``demo_rules()``) teaches the demo its prompts. Ignored for a real model."""
    snapshots: SnapshotTrigger = "off"
    """When sessions snapshot the workspace (``turn_done``, ``step_done``, ``idle`` or ``off``); the store is
    ``<data_dir>/snapshots``."""
    mcp_servers: tuple[McpServer, ...] = ()
    """MCP servers whose tools the loops offer (through the gate, like the built-ins)."""
    mcp_report: Callable[[str], None] | None = None
    """Where a server that cannot be loaded is reported (one line each; default: a warning in the log)."""
    mcp_errlog: TextIO | None = None
    """Where stdio MCP servers write their stderr (default: this process's)."""
    ask_user_timeout: float | None = None
    """Seconds an ask_user question waits for its answer; None: the main loop has no ask_user tool (nobody to ask)."""
    mode: str | None = None
    """The mode the main loop's sessions start in (``plan`` or ``build``; None: ``build``)."""
    foreign: ForeignEngine | None = None
    """A foreign engine (`loopd.harness.foreign`): the main loop hands its turns to that CLI (run in the workspace,
    at most `FOREIGN_TURN_TIMEOUT` seconds a turn); no model is opened, no tools, MCP servers or subagents."""


@asynccontextmanager
async def open_standard_rig(settings: HarnessSettings, *, clock: Clock | None = None) -> AsyncIterator[Rig]:
    """The standard rig for the block's duration (journal + model opened, closed on exit).

    ``clock`` (the system clock when None) is the rig's (event stamps, gate deadlines and timers) and measures the
    journal followers' polls.
    """
    clock = clock or SystemClock()
    settings.workspace.mkdir(parents=True, exist_ok=True)
    ensure_private_dir(settings.data_dir)  # the journal holds transcripts: 0700
    workspace = Workspace(settings.workspace)
    async with AsyncExitStack() as stack:
        journal: Journal
        if settings.journal_dsn is not None:
            from loopd.harness.journal import PostgresJournal

            journal = await PostgresJournal.open(settings.journal_dsn, clock=clock)
        else:
            journal = await SqliteJournal.open(settings.data_dir / JOURNAL_FILE, clock=clock)
        stack.push_async_callback(journal.aclose)
        if settings.foreign is not None:
            engine = replace(settings.foreign, cwd=settings.foreign.cwd or workspace.root)
            foreign_loop = LoopDefinition(
                name=MAIN_LOOP,
                model=engine,
                access=settings.policy.access,
                gate_timeout=settings.gate_timeout,
                model_timeout=FOREIGN_TURN_TIMEOUT,
            )
            yield Rig(
                loops=[foreign_loop],
                journal=journal,
                name=settings.name,
                workspace=workspace.root,
                rules=FileRuleStore.for_workspace(workspace.root),
                budget=settings.budget,
                clock=clock,
                snapshots=None
                if settings.snapshots == "off"
                else SnapshotPolicy(root=settings.data_dir / "snapshots", on=settings.snapshots),
                price=_adapter_priced(settings.model.price_table()),  # a CLI reporting tokens only (codex)
            )
            return
        demo: DemoOptions | None = None
        if settings.demo_rules and settings.model.is_demo:
            from loopd.harness.models import DemoOptions  # the scripted server's module: loaded for the demo only

            demo = DemoOptions(rules=settings.demo_rules)
        model = await stack.enter_async_context(open_model(settings.model, demo=demo))
        prices = settings.model.price_table()
        sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
        hidden = (settings.data_dir, default_data_dir(), *settings.hidden)
        tools: tuple[Tool, ...] = tuple(default_tools(workspace, sandbox=sandbox, hidden=hidden))
        if settings.mcp_servers:
            from loopd.harness.tools import open_configured_mcp_tools  # the MCP SDK: loaded only when configured

            mcp_tools = await stack.enter_async_context(
                open_configured_mcp_tools(
                    settings.mcp_servers, report=settings.mcp_report or _log.warning, errlog=settings.mcp_errlog
                )
            )
            tools = (*tools, *mcp_tools)

        def define(
            name: str, prompt: str, *, ask: bool = False, modes: tuple[LoopMode, ...] = (), mode: str | None = None
        ) -> LoopDefinition:
            asking = (AskUserTool(timeout=settings.ask_user_timeout),) if ask and settings.ask_user_timeout else ()
            return LoopDefinition(
                name=name,
                model=model,
                model_name=settings.model.model,
                tools=(*tools, *asking),
                system_prompt=prompt,
                max_steps=settings.max_steps,
                access=settings.policy.access,
                gate_timeout=settings.gate_timeout,
                tool_timeout=settings.tool_timeout,
                compact_at_tokens=settings.compact_at_tokens,
                modes=modes,
                mode=mode,
            )

        loop = define(MAIN_LOOP, settings.system_prompt, ask=True, modes=STANDARD_MODES, mode=settings.mode)
        helper = define(HELPER_AGENT, HELPER_PROMPT)
        yield Rig(
            loops=[loop],
            agents=[helper] if settings.max_agents > 0 else [],
            max_agent_depth=1,
            max_agents=max(settings.max_agents, 0),
            journal=journal,
            name=settings.name,
            workspace=workspace.root,
            price=_adapter_priced(prices),
            rules=FileRuleStore.for_workspace(workspace.root),
            budget=settings.budget,
            clock=clock,
            snapshots=None
            if settings.snapshots == "off"
            else SnapshotPolicy(root=settings.data_dir / "snapshots", on=settings.snapshots),
        )


def _adapter_priced(prices: PriceTable) -> Callable[[str, Usage], Usage]:
    """The rig's pricing: the cost the model's adapter already set (it priced the model that really served the call,
    with its cache writes; a fallback chain's name is in no table), else the table's price for ``model``."""

    def price(model: str, usage: Usage) -> Usage:
        return usage if usage.cost_usd > 0 else prices.cost_of(model, usage)

    return price


ToolsProfile = Literal["none", "read", "write"]
TOOLS_PROFILES: Final[tuple[ToolsProfile, ...]] = ("none", "read", "write")
READ_TOOLS: Final = ("read_file", "list_dir", "glob", "grep")
WRITE_TOOLS: Final = (*READ_TOOLS, "write_file", "edit_file", "bash")
_PROFILE_TOOLS: Final[dict[str, tuple[str, ...]]] = {"none": (), "read": READ_TOOLS, "write": WRITE_TOOLS}
_SEGMENT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_LOCATION_SEGMENTS: Final = 12
MAX_LOCATION_CHARS: Final = 512


class WorkspaceLocationError(HarnessError):
    """A workspace location that is malformed, or that resolves (through a symlink) outside the workspaces root."""


def check_workspace_location(location: str) -> str:
    """``location`` when it is a relative path of plain segments (``[A-Za-z0-9][A-Za-z0-9._-]*``, no ``..``, no
    leading ``/``, at most 12 segments and 512 characters); `WorkspaceLocationError` otherwise. Pure."""
    if not isinstance(location, str) or not location or len(location) > MAX_LOCATION_CHARS:
        raise WorkspaceLocationError(f"a workspace is a relative path of at most {MAX_LOCATION_CHARS} characters")
    segments = location.split("/")
    if len(segments) > MAX_LOCATION_SEGMENTS or not all(_SEGMENT.fullmatch(part) for part in segments):
        raise WorkspaceLocationError(
            f"workspace {location!r}: each /-separated part must start with a letter or digit and hold only letters, "
            "digits, '.', '_' and '-' (no '..', no absolute path)"
        )
    if any(part.strip(".") == "" for part in segments):  # pragma: no cover - the pattern already refuses them
        raise WorkspaceLocationError(f"workspace {location!r} names a parent or current directory")
    return location


def profile_access(profile: ToolsProfile, *, confined: bool) -> AccessConfig:
    """The configured gate access of an unattended call with ``profile``: what it offers is allowed (file reads;
    file writes; bash only when ``confined``, i.e. the sandbox shows commands nothing but the workspace), everything
    else keeps asking."""
    kinds: dict[str, Access] = {}
    if profile in ("read", "write"):
        kinds[FS_READ] = Access.ALLOW
    if profile == "write":
        kinds[FS_WRITE] = Access.ALLOW
        if confined:
            kinds[EXEC] = Access.ALLOW
    return AccessConfig(kinds=kinds)


@dataclass(frozen=True)
class WorkspaceRigs:
    """Rigs like ``base`` (same model, journal, clock, prices, budget), each for one directory under ``root`` and
    one `ToolsProfile`. The session of a call is built from the same location and profile every time it is started
    or resumed, so both are part of the call's parameters. Must not: decide who may name a location."""

    base: Rig
    root: Path
    sandbox: Sandbox
    hidden: tuple[Path, ...]

    @property
    def confined(self) -> bool:
        """Whether bash's commands run confined to their workspace (any sandbox but ``none``)."""
        return self.sandbox.name != "none"

    def directory(self, location: str) -> Path:
        """``root/location``, created when missing (blocking file-system calls: run it off the event loop).
        `WorkspaceLocationError` when the location is malformed or resolves outside ``root``."""
        check_workspace_location(location)
        root = self.root.resolve()
        path = root.joinpath(*location.split("/"))
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        segments = location.split("/")
        for depth in range(1, len(segments) + 1):  # a symlink could lead into another caller's workspaces
            if root.joinpath(*segments[:depth]).is_symlink():
                raise WorkspaceLocationError(f"workspace {location!r} resolves outside {root}: a part is a symlink")
        resolved = path.resolve(strict=True)
        if not resolved.is_relative_to(root) or resolved == root:
            raise WorkspaceLocationError(f"workspace {location!r} resolves outside {root}")
        return resolved

    def rig(self, location: str | None, profile: ToolsProfile) -> Rig:
        """The rig for ``profile`` in ``root/location`` (see `directory`). Without a location only ``none`` (no tools,
        so no directory is touched) is possible: `WorkspaceLocationError` otherwise."""
        if profile not in TOOLS_PROFILES:
            raise WorkspaceLocationError(f"unknown tools profile {profile!r}: none, read or write")
        if location is None:
            if profile != "none":
                raise WorkspaceLocationError(f"tools {profile!r} need a workspace")
            path = self.base.workspace
            tools: tuple[Tool, ...] = ()
        else:
            path = self.directory(location)
            wanted = _PROFILE_TOOLS[profile]
            every = default_tools(Workspace(path), sandbox=self.sandbox, hidden=self.hidden)
            tools = tuple(tool for tool in every if tool.spec.name in wanted)
        access = profile_access(profile, confined=self.confined)
        loops = [replace(self.base.loops[0], tools=tools, access=access)]
        rules = FileRuleStore.for_workspace(path) if path is not None else self.base.rules
        return replace(self.base, loops=loops, agents=(), workspace=path, rules=rules)


def rig_on(base: Rig, settings: HarnessSettings, directory: Path) -> Rig:
    """``base`` (a rig `open_standard_rig` opened with ``settings``, its models possibly wrapped) working in
    ``directory`` instead: its built-in tools bound there (one set shared by its loops and agents, as in ``base``),
    its remembered gate rules there, a foreign engine run there. Model, journal, MCP tools, ask_user, gate policy
    and snapshot policy stay ``base``'s. Pure (no file-system call): the caller creates and checks ``directory``."""
    sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
    hidden = (settings.data_dir, default_data_dir(), *settings.hidden)
    fresh = {tool.spec.name: tool for tool in default_tools(Workspace(directory), sandbox=sandbox, hidden=hidden)}

    def rebound(definition: LoopDefinition) -> LoopDefinition:
        if isinstance(definition.model, ForeignEngine):
            return replace(definition, model=replace(definition.model, cwd=directory))
        return replace(definition, tools=tuple(fresh.get(tool.spec.name, tool) for tool in definition.tools))

    return replace(
        base,
        loops=[rebound(loop) for loop in base.loops],
        agents=[rebound(agent) for agent in base.agents],
        workspace=directory,
        rules=FileRuleStore.for_workspace(directory),
    )


def workspace_rigs(base: Rig, settings: HarnessSettings, root: Path) -> WorkspaceRigs:
    """`WorkspaceRigs` over ``base`` (a rig `open_standard_rig` opened with ``settings``), for workspaces under
    ``root``; bash in them runs in the same sandbox and hides the same directories as ``base``'s."""
    sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
    hidden = (settings.data_dir, default_data_dir(), *settings.hidden)
    return WorkspaceRigs(base=base, root=root, sandbox=sandbox, hidden=hidden)
