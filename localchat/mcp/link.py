"""One MCP server's connection, in the hub's event loop (``hub``): started, listed, called, stopped.

The protocol is the official SDK's (``mcp``): ``stdio_client`` runs a local server (inside
``guard``, which gives it its environment and ends it with localchat) with its stderr in a private
log; ``streamable_http_client`` reaches a remote one. A link never raises out of ``start``: what
went wrong becomes its state and one line (with the last line of the server's stderr), and the chat
goes on without its tools. ``state`` is what ``/mcp`` shows.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

from localchat.files import private_dirs
from localchat.log_lines import error_line
from localchat.mcp.config import HttpServer, McpServerConfig, StdioServer
from localchat.mcp.guard import KEEP, PIDFILE

MAX_PAGES = 50  # tools/list pages read, at most
MAX_LISTED = 1000  # tools read from one server, at most
STOP_S = 10.0  # the SDK's own shutdown: stdin closed, 2 s, SIGTERM to the group, 2 s, SIGKILL


class LinkDown(Exception):
    """The server cannot take a call now (it failed, died or was stopped)."""


def first_cause(exc: BaseException) -> BaseException:
    """The exception that started it all, out of anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    exc = first_cause(exc)
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ServerLink:
    def __init__(self, config: McpServerConfig, *, log_path: Path | None, pid_path: Path | None):
        self.config, self.log_path, self.pid_path = config, log_path, pid_path
        self.state = "not started"  # starting | ready | failed | died | down | stopped
        self.problem: str | None = None
        self.tools: list[Any] = []  # mcp_types.Tool, as listed
        self.changed = False  # the server sent notifications/tools/list_changed
        self.refused: list[tuple[str, str]] = []  # (tool, why): tools its listing had that break the protocol
        self.restarts = 0
        self.unreadable_listing: str | None = None  # why the last tools/list after list_changed could not be read
        self._session: Any = None
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._log: TextIO | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def pid(self) -> int | None:
        try:
            return int(self.pid_path.read_text()) if self.pid_path else None
        except (OSError, ValueError):
            return None

    def last_log_line(self) -> str:
        """The server's own words on why it failed: the last error-looking line it wrote on stderr
        (``Caused by: invalid peer certificate: UnknownIssuer``, not the hint after it), or its last
        line; "" when it wrote nothing."""
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path is not None else ""
            lines = [line.strip() for line in text.splitlines() if line.strip()]
        except OSError:
            return ""
        return error_line(lines)[:200]

    async def start(self, timeout_s: float) -> None:
        """Connected, initialized and its tools listed within ``timeout_s``; else ``failed``."""
        self.state, self.problem, self.changed = "starting", None, False
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"mcp {self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), timeout_s)
        except asyncio.TimeoutError:
            self._fail(f"did not answer initialize and tools/list within {timeout_s:g}s (--mcp-timeout)")
            await self.stop(state="failed")

    async def _run(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                from mcp import ClientSession

                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._heard))
                await session.initialize()
                self.tools = await self._listed(session)
                self._session, self.state = session, "ready"
                self._ready.set()
                await self._stop.wait()
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - whatever a server or its transport does is its state
            self._fail("it ended before it answered" if _closed(exc) else describe(exc))
        finally:
            self._session = None
            self._ready.set()
            if self._log is not None:
                self._log.close()
                self._log = None

    def _transport(self) -> Any:
        if isinstance(self.config, HttpServer) and self.config.legacy_sse:
            from mcp.client.sse import sse_client

            return sse_client(self.config.url, headers=self.config.headers)
        if isinstance(self.config, HttpServer):
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            return streamable_http_client(self.config.url, http_client=create_mcp_http_client(
                headers=self.config.headers))
        return self._stdio(self.config)

    def _stdio(self, config: StdioServer) -> Any:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self._log = _private_log(self.log_path)
        base = {name: os.environ[name] for name in ("LANG", "TMPDIR") if name in os.environ}
        env = {**base, **config.env, KEEP: json.dumps(list(config.env)), PIDFILE: str(self.pid_path)}
        params = StdioServerParameters(command=sys.executable, args=["-m", "localchat.mcp.guard", config.command,
                                                                     *config.args], env=env, cwd=config.cwd)
        return stdio_client(params, errlog=self._log)

    async def _listed(self, session: Any) -> list[Any]:
        """Every page of ``tools/list``, as the SDK validates it; when one tool breaks the protocol's
        schema (the SDK then refuses the whole page), the page read again tool by tool, so that only
        the broken tools are left out (``refused``: said once, by the hub)."""
        import mcp_types as types
        from pydantic import ValidationError

        tools, cursor = [], None
        for _ in range(MAX_PAGES):
            params: types.PaginatedRequestParams | None = (
                types.PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            try:
                page = await session.list_tools(params=params)
                found, cursor = page.tools, page.next_cursor
            except ValidationError as exc:
                found, cursor = await self._tool_by_tool(session, params, exc)
            tools += found
            if not cursor or len(tools) >= MAX_LISTED:
                break
        return tools[:MAX_LISTED]

    async def _tool_by_tool(self, session: Any, params: Any, refusal: Exception) -> tuple[list[Any], str | None]:
        import mcp_types as types
        from pydantic import ValidationError

        send = getattr(getattr(session, "_dispatcher", None), "send_raw_request", None)
        if send is None:  # an SDK without it: the whole list is refused, as the SDK says
            raise refusal
        raw = await send("tools/list", params.model_dump(by_alias=True, exclude_none=True) if params else None, {})
        kept = []
        entries = raw.get("tools") if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            raise refusal  # not a list of tools at all: nothing of the page can be read
        for position, entry in enumerate(entries):
            try:
                kept.append(types.Tool.model_validate(entry, by_name=False))
            except ValidationError as exc:
                name = entry.get("name") if isinstance(entry, dict) else None
                self.refused.append((str(name or f"tool {position + 1}"), _first_error(exc)))
        cursor = raw.get("nextCursor") if isinstance(raw, dict) else None
        cursor = cursor if isinstance(cursor, str) else None
        absorb = getattr(session, "_absorb_tool_listing", None)  # what the SDK's own list_tools does with a page
        if absorb is not None:
            absorb(types.ListToolsResult(tools=kept, next_cursor=cursor), complete=params is None and cursor is None)
        return kept, cursor

    async def _heard(self, message: Any) -> None:
        """A notification, or what the transport could not read (garbage: the server fails)."""
        import mcp_types as types

        if isinstance(message, Exception):
            if self.state == "starting":
                self._fail(f"it sent something that is not JSON-RPC: {_unreadable(message)}")
                self._stop.set()
                if self._task is not None:
                    self._task.cancel()
            return
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            self.changed = True

    async def refresh(self) -> bool:
        """The tools listed again after the server said they changed; True when they were."""
        if not self.changed or self._session is None:
            return False
        self.changed = False
        before = [t.model_dump() for t in self.tools]
        try:
            self.tools = await self._listed(self._session)
        except Exception as exc:  # noqa: BLE001 - a listing that cannot be read leaves the tools as they were
            self.unreadable_listing = describe(exc)
            return False
        return [t.model_dump() for t in self.tools] != before

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The server's ``CallToolResult``; ``LinkDown`` when it cannot take calls. A call past
        ``timeout_s`` raises the SDK's timeout error, after it sent ``notifications/cancelled``."""
        if self._session is None:
            raise LinkDown(self.problem or f"the server is {self.state}")
        return await self._session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)

    def died(self, why: str) -> None:
        """The server ended during a call: its session is let go (the SDK's shutdown follows)."""
        self.state, self.problem, self._session = "died", why, None
        self._stop.set()

    async def stop(self, state: str = "stopped") -> None:
        """The SDK's shutdown (the server, and its process group, end); bounded."""
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            if self._session is None:  # still starting: initialize does not wait for the stop event
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_S)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()
        if self.state not in ("failed", "down"):
            self.state = state

    def _fail(self, why: str) -> None:
        said = self.last_log_line()
        log = f" (its log: {self.log_path})" if self.log_path is not None and isinstance(self.config, StdioServer) \
            else ""
        self.state, self.problem = "failed", why + (f"; its stderr says: {said}" if said else "") + log
        self._ready.set()


def _unreadable(exc: Exception) -> str:
    """What could not be read, in a few words (pydantic's report is pages long)."""
    errors = getattr(exc, "errors", None)
    try:
        found = errors()[0].get("input") if callable(errors) else None
    except Exception:  # noqa: BLE001 - only for the wording
        found = None
    return repr(" ".join(str(found).split())[:80]) if found is not None else describe(exc)


def _first_error(exc: Exception) -> str:
    """pydantic's first complaint, in a few words: ``inputSchema: Input should be a valid dictionary``."""
    try:
        error = getattr(exc, "errors", list)()[0]  # (pydantic's ValidationError has them)
    except (IndexError, TypeError):
        return describe(exc)
    where = ".".join(str(p) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg', '')}"[:160]


def _closed(exc: BaseException) -> bool:
    """The SDK's word for a connection that ended (the server exited, or closed its stdout)."""
    import mcp_types as types

    return getattr(first_cause(exc), "code", None) == types.CONNECTION_CLOSED


def _private_log(path: Path | None) -> TextIO:
    """The server's stderr: a log only the user can read (0600), in a directory only they can enter."""
    if path is None:
        return open(os.devnull, "w")
    private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")
