"""The names this package offers for `loopd.harness.tools` (the package face)."""

from __future__ import annotations

import loopd.harness.tools as public


def test_public_names() -> None:
    assert set(public.__all__) >= {
        "EXEC",
        "FS_READ",
        "FS_WRITE",
        "MCP_KIND",
        "BashTool",
        "EditFileTool",
        "GlobTool",
        "GrepTool",
        "ListDirTool",
        "McpConnectError",
        "McpHttpServer",
        "McpServer",
        "McpStdioServer",
        "McpTool",
        "McpToolset",
        "ReadFileTool",
        "Workspace",
        "WorkspaceEscapeError",
        "WriteFileTool",
        "default_tools",
        "open_mcp_toolset",
        "scrubbed_environment",
    }
    for name in public.__all__:
        assert getattr(public, name) is not None
