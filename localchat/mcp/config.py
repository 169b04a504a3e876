"""``--mcp FILE``: MCP servers as the files users already have configure them, read unchanged.

    {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "${TZ:-UTC}"}},
                    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}}

``mcpServers`` (Claude Desktop, Claude Code's ``.mcp.json``, Cursor, Cline, LM Studio) or ``servers``
(VS Code); other top-level keys (Claude Desktop's ``globalShortcut``…) are ignored, and said once. A
server is a local process (``command``, ``args``, ``env``, ``cwd``: stdio) or a remote endpoint
(``url``, ``headers``: Streamable HTTP, or ``"type": "sse"``, the older transport). Cursor's and
Cline's ``disabled`` servers are skipped; the tools their ``autoApprove`` (Roo's ``alwaysAllow``)
names run without asking. ``${VAR}``, ``${VAR:-default}`` and VS Code's ``${env:VAR}`` in
``command``, ``args``, ``env``, ``cwd``, ``url`` and ``headers`` are read from the environment, as
Claude Code reads them, so a token stays out of the file; VS Code's ``${input:ID}``, which VS Code
prompts for, is refused in one line. Keys other editors keep for themselves (``timeout``, ``envFile``…)
are ignored, and said once; anything else (an unknown key, a wrong type, an empty command, a URL
that is not http(s), a variable that is not set) is one line naming the file, the server and the
key (exit 2); nothing is started.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat.errors import UsageError
from localchat.files import read_json_setting

VARIABLE = re.compile(r"\$\{(?:(env:)|(input:))?([A-Za-z_][A-Za-z0-9_.-]*)(?::-([^}]*))?\}")
STDIO_KEYS = {"command", "args", "env", "cwd", "type"}
HTTP_KEYS = {"url", "headers", "type"}
TYPES = {"stdio": STDIO_KEYS, "http": HTTP_KEYS, "streamable-http": HTTP_KEYS, "streamableHttp": HTTP_KEYS,
         "sse": HTTP_KEYS}
SERVER_LISTS = ("mcpServers", "servers")  # most clients; VS Code
APPROVING = ("autoApprove", "alwaysAllow")  # Cursor and Cline; Roo Code
OTHERS_KEYS = {"disabled", *APPROVING, "timeout", "transportType", "envFile", "dev", "gallery", "version",
               "description", "disabledTools", "watchPaths", "oauth"}  # kept by other clients for themselves
EDITOR_VARIABLES = {"workspaceFolder": Path.cwd, "userHome": Path.home}  # VS Code's own, read here
MAX_SERVERS = 32


@dataclass(frozen=True)
class StdioServer:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # the config's own, expanded
    cwd: Path | None = None
    auto_approve: tuple[str, ...] = ()  # tools that run without asking (the file's autoApprove)
    source: str = ""  # the file it came from

    @property
    def where(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class HttpServer:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)  # expanded; never shown
    auto_approve: tuple[str, ...] = ()
    source: str = ""
    legacy_sse: bool = False  # "type": "sse": the older HTTP+SSE transport

    @property
    def where(self) -> str:
        return self.url


McpServerConfig = StdioServer | HttpServer


def read_configs(paths: tuple[Path, ...], only: tuple[str, ...] = (), *,
                 notes: list[str] | None = None) -> list[McpServerConfig]:
    """Every enabled server of every ``--mcp`` file (a name once across them), or those ``only``
    names; what was ignored goes into ``notes``, once each."""
    servers: dict[str, McpServerConfig] = {}
    disabled: set[str] = set()
    for path in paths:
        reader = _FileReader(path, notes if notes is not None else [])
        for server in reader.servers():
            if server.name in servers or server.name in disabled:
                raise UsageError(f"--mcp {path}: server '{server.name}' is already configured in another --mcp file")
            servers[server.name] = server
        disabled |= reader.disabled
    unknown = [name for name in only if name not in servers]
    if unknown:
        known = ", ".join(servers) or "none"
        why = " is disabled in its file" if unknown[0] in disabled else ": no such server in the --mcp files"
        raise UsageError(f"--mcp-only {unknown[0]}{why} (they configure: {known})")
    return [servers[name] for name in only] if only else list(servers.values())


def read_config(path: Path) -> list[McpServerConfig]:
    """One file's enabled servers (what it would say is dropped)."""
    return _FileReader(path, []).servers()


class _FileReader:
    def __init__(self, path: Path, notes: list[str]):
        self.path, self.notes = path, notes
        self.disabled: set[str] = set()

    def note(self, text: str) -> None:
        line = f"--mcp {self.path}: {text}"
        if line not in self.notes:
            self.notes.append(line)

    def servers(self) -> list[McpServerConfig]:
        entries = self._entries(self._data())
        enabled = {}
        for name, entry in entries.items():
            if isinstance(entry, dict) and entry.get("disabled") is True:
                self.disabled.add(name)
            else:
                enabled[name] = entry
        if self.disabled:
            self.note(f"skipped {', '.join(_shown(n) for n in sorted(self.disabled))} (disabled in the file)")
        return [self.server_of(name, entry) for name, entry in enabled.items()]

    def _data(self) -> dict:
        path = self.path
        data = read_json_setting(path, "--mcp")
        if not isinstance(data, dict):
            raise UsageError(f"--mcp {path}: expected an object with mcpServers (or VS Code's servers), not "
                             f"{type(data).__name__}")
        return data

    def _entries(self, data: dict) -> dict:
        found = [key for key in SERVER_LISTS if key in data]
        if not found:
            keys = ", ".join(_shown(k) for k in list(data)[:5]) or "none"
            raise UsageError(f"--mcp {self.path}: no mcpServers (or VS Code's servers) in the file; its keys: {keys}")
        if len(found) > 1:
            raise UsageError(f"--mcp {self.path}: both mcpServers and servers: keep one")
        entries = data[found[0]]
        if not isinstance(entries, dict):
            raise UsageError(f"--mcp {self.path}: {found[0]} must be an object of servers by name")
        ignored = [k for k in data if k != found[0]]
        if ignored:
            self.note(f"ignored {', '.join(_shown(k) for k in ignored[:8])} (not MCP servers)")
        if not entries:
            raise UsageError(f"--mcp {self.path}: {found[0]} is empty")
        if len(entries) > MAX_SERVERS:
            raise UsageError(f"--mcp {self.path}: {len(entries)} servers, over the {MAX_SERVERS} localchat starts")
        return entries

    def server_of(self, name: str, entry: Any) -> McpServerConfig:
        def wrong(key: str, why: str) -> UsageError:
            return UsageError(f"--mcp {self.path}: server '{_shown(name)}': {key} {why}")

        if not name or len(name) > 64 or any(not c.isprintable() for c in name):
            raise UsageError(f"--mcp {self.path}: a server name must be 1 to 64 printable characters, not "
                             f"{_shown(name)!r}")
        if not isinstance(entry, dict):
            raise wrong("its entry", "must be an object")
        kind = entry.get("type", entry.get("transportType", "http" if "url" in entry else "stdio"))
        if kind not in TYPES:
            raise wrong("type", f"must be stdio, http or sse, not {_shown(kind)!r}")
        unknown = sorted(set(entry) - TYPES[kind] - OTHERS_KEYS)
        if unknown:
            raise wrong(unknown[0], f"is not a key of a{'n http' if kind != 'stdio' else ' stdio'} server "
                                    f"(it takes: {', '.join(sorted(TYPES[kind]))})")
        ignored = sorted(set(entry) & OTHERS_KEYS - {"disabled", *APPROVING, "transportType"})
        if ignored:
            self.note(f"server '{_shown(name)}': ignored {', '.join(ignored)} (other clients' settings)")
        common = dict(name=name, auto_approve=self._approved(entry, wrong), source=str(self.path))
        if kind == "stdio":
            return self._stdio(entry, wrong, common)
        return self._http(entry, wrong, common, legacy_sse=kind == "sse")

    @staticmethod
    def _approved(entry: dict, wrong) -> tuple[str, ...]:
        names: list[str] = []
        for key in APPROVING:
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise wrong(key, "must be a list of tool names")
            names += value
        return tuple(dict.fromkeys(names))

    def _stdio(self, entry: dict, wrong, common: dict) -> StdioServer:
        command, args, env, cwd = entry.get("command"), entry.get("args", []), entry.get("env", {}), entry.get("cwd")
        if not isinstance(command, str) or not command.strip():
            raise wrong("command", "must be a program to run (a non-empty string)")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise wrong("args", "must be a list of strings")
        command = self.expanded(command, "command", wrong)
        args = [self.expanded(a, f"args.{i}", wrong) for i, a in enumerate(args)]
        if any("\0" in a for a in [command, *args]):
            raise wrong("args", "hold a NUL character")
        env = _strings(env, "env", wrong)
        if cwd is not None and (not isinstance(cwd, str) or not cwd):
            raise wrong("cwd", "must be a directory (a string)")
        directory = Path(self.expanded(cwd, "cwd", wrong)).expanduser() if cwd else None
        if directory is not None and not directory.is_dir():
            raise wrong("cwd", f"is not a directory ({directory})")
        env = {k: self.expanded(v, f"env.{k}", wrong) for k, v in env.items()}
        if any("\0" in v or "\n" in v for v in env.values()):
            raise wrong("env", "holds a NUL or a line break once its variables are read")
        return StdioServer(command=command, args=tuple(args), cwd=directory, env=env, **common)

    def _http(self, entry: dict, wrong, common: dict, legacy_sse: bool) -> HttpServer:
        import httpx

        url = entry.get("url")
        if not isinstance(url, str) or not url:
            raise wrong("url", "must be the server's http(s) URL (a string)")
        url = self.expanded(url, "url", wrong)
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError):
            raise wrong("url", "is not a URL") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise wrong("url", f"must be an http:// or https:// URL, not {parsed.scheme or 'none'}://")
        if parsed.userinfo:
            raise wrong("url", "holds credentials: put them in headers, from ${VAR} (the URL is not shown)")
        headers = {k: self.expanded(v, f"headers.{k}", wrong)
                   for k, v in _strings(entry.get("headers", {}), "headers", wrong).items()}
        return HttpServer(url=url, headers=headers, legacy_sse=legacy_sse, **common)

    @staticmethod
    def expanded(text: str, key: str, wrong) -> str:
        """``text`` with each ``${VAR}`` (``${env:VAR}``, ``${VAR:-default}``) replaced by the
        variable's value, VS Code's ``${workspaceFolder}`` and ``${userHome}`` by the current and
        home directories; a variable not set (without a default) is refused, and so is VS Code's
        ``${input:ID}``, which VS Code prompts for (localchat does not)."""
        def value(match: re.Match) -> str:
            _, is_input, name, default = match.groups()
            if is_input:
                raise wrong(key, f"uses ${{input:{name}}}, a value VS Code prompts for: put it in an environment "
                                 f"variable and write ${{env:NAME}} instead")
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            if name in EDITOR_VARIABLES:
                return str(EDITOR_VARIABLES[name]())
            raise wrong(key, f"uses ${{{name}}}, which is not set in the environment")

        return VARIABLE.sub(value, text)


def _strings(value: Any, key: str, wrong) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise wrong(key, "must be an object of strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v or "\n" in v for k, v in value.items()):
        raise wrong(key, "holds an empty name, '=' in a name, a NUL or a line break")
    return value


def _shown(text: Any) -> str:
    text = str(text)
    return text if len(text) <= 40 else text[:39] + "…"
