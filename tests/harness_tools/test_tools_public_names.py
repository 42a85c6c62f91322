"""The names this package offers for `loopd.harness.tools` (merged by the lead from `_public_extra`)."""

from __future__ import annotations

import loopd.harness.tools._public_extra as public


def test_public_names() -> None:
    assert sorted(public.__all__) == sorted(
        [
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
        ]
    )
    for name in public.__all__:
        assert getattr(public, name) is not None
