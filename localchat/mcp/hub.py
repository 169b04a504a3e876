"""MCP servers as one source of tools for the tool runner (``tools.runner.ToolSource``).

The SDK is asynchronous and the chat is not: the hub runs one event loop in a thread of its own,
where every server's link lives, and waits for it from the chat's thread in short steps, so Ctrl+C
and SIGTERM arrive as always (a call they interrupt is cancelled: the SDK sends
``notifications/cancelled``). Servers start in parallel, each within ``--mcp-timeout``; one that
fails is one line and the chat goes on without its tools. A server that dies during a call makes
that call's result an error, is started again once on the next call, and is down after that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat.mcp.config import McpServerConfig, StdioServer
from localchat.mcp.link import LinkDown, ServerLink, describe
from localchat.mcp.tools import INVALID, exposed_name, result_text, tool_entry
from localchat.processes import alive, parent_of, signal_group
from localchat.tools.host import ToolOutput, ToolProcessError, ToolTimeout

DEFAULT_MCP_TIMEOUT_S = 20.0
MAX_OFFERED = 128  # OpenAI-style APIs take at most 128 tools in a request
STEP_S = 0.1


@dataclass(frozen=True)
class ServerInfo:
    """A line of ``/mcp``."""

    name: str
    state: str
    tools: int
    where: str  # pid N, or the URL
    log: Path | None
    problem: str | None


class McpHub:
    name = "MCP servers"

    def __init__(self, configs: list[McpServerConfig], *, start_timeout_s: float = DEFAULT_MCP_TIMEOUT_S,
                 call_timeout_s: float = 30.0, logs_dir: Path | None = None, taken: Collection[str] = frozenset(),
                 on_notice: Callable[[str], None] = lambda _: None):
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self._taken, self._notice = set(taken), on_notice
        self._said: set[str] = set()
        quiet_library_logs()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._thread.start()
        self.links = [ServerLink(c, log_path=_file(logs_dir, c.name, "log"), pid_path=_file(logs_dir, c.name, "pid"))
                      for c in configs]
        self._names: dict[str, tuple[ServerLink, str]] = {}
        self.specs: list[dict[str, Any]] = []
        try:
            self._wait(self._start_all())
        except BaseException:
            self.close()
            raise
        for link in self.links:
            if link.state != "ready":
                self._say_once(f"MCP server '{link.name}' did not start: {link.problem}; the chat goes on without "
                               "its tools")
        self._expose()

    async def _start_all(self) -> None:
        await asyncio.gather(*(link.start(self.start_timeout_s) for link in self.links))

    async def _refresh_all(self) -> list[bool]:
        return await asyncio.gather(*(link.refresh() for link in self.links))

    async def _stop_all(self) -> None:
        await asyncio.gather(*(link.stop() for link in self.links), return_exceptions=True)

    def _wait(self, work: Coroutine) -> Any:
        """Run ``work`` in the hub's loop and wait for it here, in steps (Ctrl+C cancels it)."""
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            while True:
                try:
                    return future.result(STEP_S)
                except concurrent.futures.TimeoutError:
                    continue
        except BaseException:
            future.cancel()
            raise

    def _say_once(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self._notice(line)

    def _expose(self) -> None:
        """The names and entries the model sees: ``SERVER_TOOL``; a collision, a schema that is not
        an object's, or a tool past the 128 an API takes, is left out and said once."""
        names: dict[str, Any] = {}
        specs: list[dict[str, Any]] = []
        for link in (link for link in self.links if link.state == "ready"):
            for tool, why in link.refused:
                self._say_once(f"MCP server '{link.name}': tool '{INVALID.sub('?', tool)[:64]}' is left out: it "
                               f"breaks the protocol's schema ({why})")
            for tool in link.tools:
                name = exposed_name(link.name, tool.name)
                shown = INVALID.sub("?", tool.name)[:64]
                if name in names or name in self._taken:
                    self._say_once(f"MCP server '{link.name}': tool '{shown}' would be offered as {name}, which is "
                                   "taken: it is left out")
                    continue
                entry = tool_entry(name, tool)
                if isinstance(entry, str):
                    self._say_once(f"MCP server '{link.name}': tool '{shown}' is left out: {entry}")
                    continue
                if len(specs) == MAX_OFFERED:
                    self._say_once(f"MCP server '{link.name}': more than {MAX_OFFERED} tools in all; the rest are "
                                   "left out (--mcp-only picks servers)")
                    break
                names[name] = (link, tool.name)
                specs.append(entry)
        self._names, self.specs = names, specs

    def origin(self, name: str) -> str:
        link = self._names.get(name, (None, ""))[0]
        return f"MCP server {link.name}" if link else self.name

    def preapproved(self, name: str) -> str | None:
        """Why ``name`` runs without asking: its server's autoApprove (or alwaysAllow) names it, by
        the server's own tool name or the name the model sees."""
        link, tool = self._names.get(name, (None, ""))
        if link is None or not ({tool, name} & set(link.config.auto_approve)):
            return None
        return f"autoApprove of server '{link.name}' in {link.config.source}"

    def refresh(self) -> bool:
        """Tools listed again where a server said they changed (before the next round)."""
        if not any(link.changed for link in self.links):
            return False
        changed = self._wait(self._refresh_all())
        for link in self.links:
            if link.unreadable_listing:
                self._say_once(f"MCP server '{link.name}' said its tools changed, then sent a list that cannot be "
                               f"read ({link.unreadable_listing[:120]}): its earlier tools stay")
                link.unreadable_listing = None
        if any(changed):
            self._expose()
        return any(changed)

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        link, tool = self._names[name]
        started = time.perf_counter()
        if link.state == "died":
            self._restart(link)
        try:
            result = self._wait(link.call(tool, arguments, self.call_timeout_s))
        except LinkDown as exc:
            raise ToolProcessError(f"MCP server '{link.name}' cannot take calls: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the SDK's errors, and answers that are not a result
            return self._failed(link, name, exc, time.perf_counter() - started)
        ok, text = result_text(result)
        return ToolOutput(ok=ok, content=text, seconds=time.perf_counter() - started)

    def _failed(self, link: ServerLink, name: str, exc: Exception, seconds: float) -> ToolOutput:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError

        if isinstance(exc, MCPError) and exc.code == types.REQUEST_TIMEOUT:
            raise ToolTimeout(f"the tool {name} did not finish within {self.call_timeout_s:g}s (--tool-timeout); "
                              "the call was cancelled") from None
        if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
            link.died("it ended during a call")
            raise ToolProcessError(f"MCP server '{link.name}' ended during the call (it is started again once, on "
                                   "the next call)") from None
        if isinstance(exc, MCPError):
            return ToolOutput(ok=False, content=f"error: {exc.error.message[:500]}", seconds=seconds)
        return ToolOutput(ok=False, content=f"error: the server's answer could not be read ({describe(exc)})",
                          seconds=seconds)

    def _restart(self, link: ServerLink) -> None:
        """Once: the server again; after that (or if it fails), it is down."""
        if link.restarts >= 1:
            link.state = "down"
            return
        link.restarts += 1
        self._wait(link.stop(state="died"))
        self._wait(link.start(self.start_timeout_s))
        if link.state != "ready":
            link.state = "down"
            self._say_once(f"MCP server '{link.name}' is down: {link.problem}")

    def servers(self) -> list[ServerInfo]:
        return [
            ServerInfo(
                name=link.name,
                state=link.state,
                tools=sum(1 for owner, _ in self._names.values() if owner is link),
                where=f"pid {link.pid}"
                if isinstance(link.config, StdioServer) and link.pid
                else link.config.where
                if not isinstance(link.config, StdioServer)
                else "-",
                log=link.log_path if isinstance(link.config, StdioServer) else None,
                problem=link.problem,
            )
            for link in self.links
        ]

    def close(self) -> None:
        """Every server stopped (the SDK's shutdown, bounded), then whatever is left of their
        process groups; the loop and its thread end."""
        if not self._thread.is_alive():
            return
        try:
            self._wait(self._stop_all())
        finally:
            for link in self.links:
                pid = link.pid
                if pid and parent_of(pid) == os.getpid():  # a guard still running: its whole group goes
                    signal_group(pid, signal.SIGKILL)
                if link.pid_path is not None:
                    link.pid_path.unlink(missing_ok=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


def quiet_library_logs() -> None:
    """The SDK logs what it cannot read, with a traceback, to stderr: what goes wrong reaches the
    user as one line of localchat's instead (a server's own stderr is in its log)."""
    import logging

    for name in ("mcp", "client", "httpx2", "httpx"):  # ("client": the SDK's session logs under that name)
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def _file(directory: Path | None, server: str, suffix: str) -> Path | None:
    """This chat's own file for a server (two chats may run servers of one name)."""
    return directory / f"mcp-{INVALID.sub('_', server)[:64]}-{os.getpid()}.{suffix}" if directory else None


def prune_logs(directory: Path, keep_days: float = 7.0) -> None:
    """MCP logs older than a week go (each chat writes its own), and the pid files of chats that
    are no longer running (one killed with SIGKILL could not remove its own)."""
    cutoff = time.time() - keep_days * 86400
    for path in directory.glob("mcp-*.log") if directory.is_dir() else ():
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            pass
    for path in directory.glob("mcp-*.pid") if directory.is_dir() else ():
        chat = path.stem.rsplit("-", 1)[-1]
        if chat.isdigit() and not alive(int(chat)):
            path.unlink(missing_ok=True)
