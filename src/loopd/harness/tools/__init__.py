"""Tool seam, built-in tools and MCP tools."""

from loopd.harness.tools._bash import BashTool, scrubbed_environment
from loopd.harness.tools._builtins import default_tools
from loopd.harness.tools._files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
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
from loopd.harness.tools._protocol import (
    GrantCandidate,
    PreparedCall,
    Requirement,
    Tool,
    ToolContext,
    ToolResult,
)
from loopd.harness.tools._requirements import EXEC, FS_READ, FS_WRITE
from loopd.harness.tools._search import GlobTool, GrepTool
from loopd.harness.tools._testing import EchoTool
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError

__all__ = [
    "EXEC",
    "FS_READ",
    "FS_WRITE",
    "MCP_KIND",
    "BashTool",
    "EchoTool",
    "EditFileTool",
    "GlobTool",
    "GrantCandidate",
    "GrepTool",
    "ListDirTool",
    "McpConnectError",
    "McpHttpServer",
    "McpServer",
    "McpStdioServer",
    "McpTool",
    "McpToolset",
    "PreparedCall",
    "ReadFileTool",
    "Requirement",
    "Tool",
    "ToolContext",
    "ToolResult",
    "Workspace",
    "WorkspaceEscapeError",
    "WriteFileTool",
    "default_tools",
    "open_mcp_toolset",
    "scrubbed_environment",
]
