"""Tool seam, built-in tools and MCP tools.

The MCP names are loaded on first use (the MCP SDK takes ~0.5 s to import, and most processes never need it).
"""

from typing import TYPE_CHECKING, Any

from loopd.harness.tools._ask import ASK_TIMEOUT_DEFAULT, ASK_USER, AskUserTool
from loopd.harness.tools._bash import BashTool, scrubbed_environment
from loopd.harness.tools._builtins import default_tools
from loopd.harness.tools._files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from loopd.harness.tools._protocol import (
    GrantCandidate,
    PreparedCall,
    Requirement,
    Tool,
    ToolContext,
    ToolResult,
)
from loopd.harness.tools._requirements import EXEC, FS_READ, FS_WRITE
from loopd.harness.tools._sandbox import (
    SANDBOX_MODES,
    UNCONFINED,
    BubblewrapSandbox,
    Sandbox,
    SandboxError,
    SandboxUnavailableError,
    Unconfined,
    resolve_sandbox,
)
from loopd.harness.tools._search import GlobTool, GrepTool
from loopd.harness.tools._testing import EchoTool
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError

if TYPE_CHECKING:
    from loopd.harness.tools._mcp import (
        MCP_KIND,
        McpConnectError,
        McpHttpServer,
        McpServer,
        McpStdioServer,
        McpTool,
        McpToolset,
        open_mcp_toolset,
    )
    from loopd.harness.tools._mcp_config import (
        WORKSPACE_MCP_FILE,
        McpConfigError,
        describe_server,
        load_mcp_config,
        open_configured_mcp_tools,
        parse_mcp_servers,
        workspace_mcp_file,
    )

_LAZY_MCP_CONFIG = frozenset(
    {
        "WORKSPACE_MCP_FILE",
        "McpConfigError",
        "describe_server",
        "load_mcp_config",
        "open_configured_mcp_tools",
        "parse_mcp_servers",
        "workspace_mcp_file",
    }
)
_LAZY_MCP = frozenset(
    {
        "MCP_KIND",
        "McpConnectError",
        "McpHttpServer",
        "McpServer",
        "McpStdioServer",
        "McpTool",
        "McpToolset",
        "open_mcp_toolset",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LAZY_MCP:
        from loopd.harness.tools import _mcp

        return getattr(_mcp, name)
    if name in _LAZY_MCP_CONFIG:
        from loopd.harness.tools import _mcp_config

        return getattr(_mcp_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ASK_TIMEOUT_DEFAULT",
    "ASK_USER",
    "EXEC",
    "FS_READ",
    "FS_WRITE",
    "MCP_KIND",
    "SANDBOX_MODES",
    "UNCONFINED",
    "WORKSPACE_MCP_FILE",
    "AskUserTool",
    "BashTool",
    "BubblewrapSandbox",
    "EchoTool",
    "EditFileTool",
    "GlobTool",
    "GrantCandidate",
    "GrepTool",
    "ListDirTool",
    "McpConfigError",
    "McpConnectError",
    "McpHttpServer",
    "McpServer",
    "McpStdioServer",
    "McpTool",
    "McpToolset",
    "PreparedCall",
    "ReadFileTool",
    "Requirement",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailableError",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Unconfined",
    "Workspace",
    "WorkspaceEscapeError",
    "WriteFileTool",
    "default_tools",
    "describe_server",
    "load_mcp_config",
    "open_configured_mcp_tools",
    "open_mcp_toolset",
    "parse_mcp_servers",
    "resolve_sandbox",
    "scrubbed_environment",
    "workspace_mcp_file",
]
