"""The standard harness: the rig that `loopd run`, `loopd harness serve` and loop-server's built-in harness share.

One loop (``main``) with the configured model, the workspace-confined built-in tools, the gate (configured access
from a headless policy + stored rules in ``<workspace>/.loopd/gate-rules.json``), pricing from the model's price
table, an optional budget, compaction past ``compact_at_tokens``, a ``helper`` subagent definition the main loop
may delegate to (same tools and gate, depth 1), and a SQLite journal in the data directory. Open it with
`open_standard_rig`; it closes the journal and the model (and the demo model's in-process server) on exit.

bash runs its commands in the configured sandbox (default: ``$LOOPD_SANDBOX``, else bubblewrap when it works
here), which hides the data directory, loopd's default data directory (where `loopd up` keeps its credentials)
and every other ``hidden`` directory from them, even inside the workspace (e.g. `loopd run` in the home directory).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from loopd._infra.clock import Clock, SystemClock
from loopd._paths import default_data_dir, ensure_private_dir
from loopd.harness.actors import UNLIMITED, Budget, LoopDefinition, Rig
from loopd.harness.gate import DEFAULT_POLICY, GATE_TIMEOUT_DEFAULT, FileRuleStore, GatePolicy
from loopd.harness.journal import Journal, SqliteJournal
from loopd.harness.models import ModelConfig, open_model
from loopd.harness.tools import Sandbox, Workspace, default_tools, resolve_sandbox

if TYPE_CHECKING:
    from loopd.harness.models import DemoOptions, DemoRule

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "HELPER_AGENT",
    "JOURNAL_FILE",
    "MAIN_LOOP",
    "HarnessSettings",
    "default_data_dir",
    "open_standard_rig",
]

JOURNAL_FILE: Final = "journal.db"
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
        demo: DemoOptions | None = None
        if settings.demo_rules and settings.model.is_demo:
            from loopd.harness.models import DemoOptions  # the scripted server's module: loaded for the demo only

            demo = DemoOptions(rules=settings.demo_rules)
        model = await stack.enter_async_context(open_model(settings.model, demo=demo))
        prices = settings.model.price_table()
        sandbox = settings.sandbox if settings.sandbox is not None else resolve_sandbox()
        hidden = (settings.data_dir, default_data_dir(), *settings.hidden)
        tools = tuple(default_tools(workspace, sandbox=sandbox, hidden=hidden))

        def define(name: str, prompt: str) -> LoopDefinition:
            return LoopDefinition(
                name=name,
                model=model,
                model_name=settings.model.model,
                tools=tools,
                system_prompt=prompt,
                max_steps=settings.max_steps,
                access=settings.policy.access,
                gate_timeout=settings.gate_timeout,
                tool_timeout=settings.tool_timeout,
                compact_at_tokens=settings.compact_at_tokens,
            )

        loop = define(MAIN_LOOP, settings.system_prompt)
        helper = define(HELPER_AGENT, HELPER_PROMPT)
        yield Rig(
            loops=[loop],
            agents=[helper] if settings.max_agents > 0 else [],
            max_agent_depth=1,
            max_agents=max(settings.max_agents, 0),
            journal=journal,
            name=settings.name,
            workspace=workspace.root,
            price=prices.cost_of,
            rules=FileRuleStore.for_workspace(workspace.root),
            budget=settings.budget,
            clock=clock,
        )
