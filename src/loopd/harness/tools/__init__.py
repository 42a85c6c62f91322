"""Tool seam, built-in tools and MCP tools."""

from loopd.harness.tools._protocol import (
    GrantCandidate,
    PreparedCall,
    Requirement,
    Tool,
    ToolContext,
    ToolResult,
)
from loopd.harness.tools._testing import EchoTool

__all__ = ["EchoTool", "GrantCandidate", "PreparedCall", "Requirement", "Tool", "ToolContext", "ToolResult"]
