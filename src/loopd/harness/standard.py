"""The standard harness: the rig that `loopd run`, `loopd harness serve` and loop-server's built-in harness share.

One loop (``main``) with the configured model, the workspace-confined built-in tools, the gate (configured access
from a headless policy + stored rules in ``<workspace>/.loopd/gate-rules.json``), pricing from the model's price
table, and a SQLite journal in the data directory. Open it with `open_standard_rig`; it closes the journal and the
model (and the demo model's in-process server) when the block exits.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from loopd.harness.gate import DEFAULT_POLICY, GATE_TIMEOUT_DEFAULT, FileRuleStore, GatePolicy
from loopd.harness.journal import SqliteJournal
from loopd.harness.models import ModelConfig, open_model
from loopd.harness.runtime import UNLIMITED, Budget, LoopDefinition, Rig
from loopd.harness.tools import Workspace, default_tools

JOURNAL_FILE: Final = "journal.db"
MAIN_LOOP: Final = "main"

DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a careful coding assistant working inside one workspace directory. Use the tools to look before you "
    "change anything, keep changes small, and say plainly what you did. Paths are relative to the workspace."
)


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$LOOPD_DATA_DIR``, else ``$XDG_DATA_HOME/loopd``, else ``~/.local/share/loopd``."""
    source = os.environ if env is None else env
    if source.get("LOOPD_DATA_DIR"):
        return Path(source["LOOPD_DATA_DIR"]).expanduser()
    base = source.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "loopd"


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
    name: str = "loopd"


@asynccontextmanager
async def open_standard_rig(settings: HarnessSettings) -> AsyncIterator[Rig]:
    """The standard rig for the block's duration (journal + model opened, closed on exit)."""
    settings.workspace.mkdir(parents=True, exist_ok=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    workspace = Workspace(settings.workspace)
    async with AsyncExitStack() as stack:
        journal = await SqliteJournal.open(settings.data_dir / JOURNAL_FILE)
        stack.push_async_callback(journal.aclose)
        model = await stack.enter_async_context(open_model(settings.model))
        prices = settings.model.price_table()
        loop = LoopDefinition(
            name=MAIN_LOOP,
            model=model,
            model_name=settings.model.model,
            tools=tuple(default_tools(workspace)),
            system_prompt=settings.system_prompt,
            max_steps=settings.max_steps,
            access=settings.policy.access,
            gate_timeout=settings.gate_timeout,
            tool_timeout=settings.tool_timeout,
        )
        yield Rig(
            loops=[loop],
            journal=journal,
            name=settings.name,
            workspace=workspace.root,
            price=prices.cost_of,
            rules=FileRuleStore.for_workspace(workspace.root),
            budget=settings.budget,
        )
