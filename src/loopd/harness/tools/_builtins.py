"""The built-in tool set for one workspace."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from loopd.harness.tools._bash import BashTool
from loopd.harness.tools._files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from loopd.harness.tools._protocol import Tool
from loopd.harness.tools._sandbox import UNCONFINED, Sandbox
from loopd.harness.tools._search import GlobTool, GrepTool
from loopd.harness.tools._workspace import Workspace


def default_tools(
    workspace: Workspace,
    *,
    bash_env: Mapping[str, str] | None = None,
    sandbox: Sandbox = UNCONFINED,
    hidden: Sequence[Path] = (),
) -> list[Tool]:
    """read_file, write_file, edit_file, list_dir, glob, grep and bash, all confined to ``workspace``.

    The two write tools share a lock, so edits within one batch never interleave on a file. bash runs its
    commands through ``sandbox``, which keeps the ``hidden`` directories out of their sight.
    """
    write_lock = asyncio.Lock()
    return [
        ReadFileTool(workspace),
        WriteFileTool(workspace, write_lock=write_lock),
        EditFileTool(workspace, write_lock=write_lock),
        ListDirTool(workspace),
        GlobTool(workspace),
        GrepTool(workspace),
        BashTool(workspace, env=bash_env, sandbox=sandbox, hidden=hidden),
    ]
