"""The tools a run offers, as one runner: the ``--tools`` files' functions (``tools.host``) and the
``--mcp`` servers' tools (``mcp.hub``), every call approved the same way, under the same limits.

Everything that can be checked is checked before anything starts (the files, the MCP
configuration, ``--approve-tools`` for runs nobody watches); then the sources start, the Python
files first (their names are taken), the MCP servers in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from localchat.errors import UsageError
from localchat.mcp.config import McpServerConfig, read_configs
from localchat.tools.host import ToolHost, known_secrets, tool_files
from localchat.tools.runner import Approve, ToolRunner, ToolSource, approve_all
from localchat.tools.settings import ToolSettings


def check_tools(settings: ToolSettings, unattended: bool = False,
                on_notice: Callable[[str], None] = lambda _: None) -> list[McpServerConfig]:
    """The MCP servers to start, once the files and configurations are known to be usable (what a
    file has that localchat ignores is said to ``on_notice``); a run nobody watches (bench, load)
    must say ``--approve-tools``."""
    if settings.mcp_only and not settings.mcp:
        raise UsageError("--mcp-only picks servers of --mcp FILE, and no --mcp file is given")
    if unattended and settings.offered and not settings.approve:
        raise UsageError("--tools or --mcp in a run nobody watches needs --approve-tools (every call runs "
                         "without asking)")
    tool_files(list(settings.files))
    notes: list[str] = []
    configs = read_configs(settings.mcp, settings.mcp_only, notes=notes)
    for note in notes:
        on_notice(note)
    return configs


def open_tools(settings: ToolSettings, approve: Approve, *, hidden: Sequence[str] = (),
               on_notice: Callable[[str], None] = lambda _: None) -> ToolRunner | None:
    """The runner over every source (None without tools); what starts is stopped if the rest fails."""
    configs = check_tools(settings, on_notice=on_notice)
    if not settings.offered:
        return None
    sources: list[ToolSource] = []
    try:
        if settings.files:
            sources.append(ToolHost(list(settings.files), settings.timeout_s, hidden=list(hidden)))
        if configs:
            sources.append(_mcp_hub(configs, settings, taken={n for s in sources for n in _names(s)},
                                    on_notice=on_notice))
    except BaseException:
        for source in sources:
            source.close()
        raise
    return ToolRunner(sources, approve, settings.max_rounds, on_notice=on_notice, secrets=known_secrets(list(hidden)))


def unattended_tools(settings: ToolSettings, on_notice: Callable[[str], None] = lambda _: None) -> ToolRunner | None:
    """The tools of a run nobody watches (bench, load): every call approved; None without tools."""
    check_tools(settings, unattended=True)
    return open_tools(settings, approve_all, on_notice=on_notice)


def _mcp_hub(configs: list[McpServerConfig], settings: ToolSettings, *, taken: set[str],
             on_notice: Callable[[str], None]) -> ToolSource:
    from localchat.home import home_dir
    from localchat.mcp.hub import McpHub, prune_logs

    logs = home_dir() / "logs"
    prune_logs(logs)
    return McpHub(configs, start_timeout_s=settings.mcp_timeout_s, call_timeout_s=settings.timeout_s,
                  logs_dir=logs, taken=taken, on_notice=on_notice)


def _names(source: ToolSource) -> list[str]:
    return [spec["function"]["name"] for spec in source.specs]


def offer_tools(backend: Any, runner: ToolRunner, on_notice: Callable[[str], None]) -> None:
    """The runner's tools offered to ``backend``; a tool the in-process call grammar cannot take
    is left out there, and said."""
    backend.offer_tools(runner.specs)
    for name, why in getattr(backend, "refused_tools", {}).items():
        on_notice(f"tool {name} is left out: its schema cannot be enforced while decoding ({why})")
