"""What a run's tools are and how their calls may run: values only, so the command line can
declare its options without loading the tools (see ``localchat.toolbox``, which opens them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_TOOL_TIMEOUT_S = 30.0
DEFAULT_MAX_TOOL_ROUNDS = 8
DEFAULT_MCP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class ToolSettings:
    """The user's functions and MCP servers the model may call, and how calls are allowed to run."""

    files: tuple[Path, ...] = ()  # --tools FILE.py
    mcp: tuple[Path, ...] = ()  # --mcp FILE (mcpServers)
    mcp_only: tuple[str, ...] = ()  # --mcp-only NAME,…: some servers of the files
    approve: bool = False  # --approve-tools: every call runs without asking
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    max_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    mcp_timeout_s: float = DEFAULT_MCP_TIMEOUT_S  # a server's initialize and tools/list

    @property
    def offered(self) -> bool:
        return bool(self.files or self.mcp)
