"""``--mcp FILE``: MCP servers as LM Studio, Claude Desktop and Cursor configure them.

    {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "${TZ}"}},
                    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}}

A server is a local process (``command``, ``args``, ``env``, ``cwd``: stdio) or a remote endpoint
(``url``, ``headers``: Streamable HTTP). ``${VAR}`` in ``env``, ``cwd``, ``url`` and ``headers`` is
read from the environment, so a token stays out of the file. Anything else (an unknown key, a wrong
type, an empty command, a URL that is not http(s), a variable that is not set) is one line naming
the file, the server and the key (exit 2); nothing is started.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.errors import UsageError
from localchat.files import read_text

VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
STDIO_KEYS = {"command", "args", "env", "cwd", "type"}
HTTP_KEYS = {"url", "headers", "type"}
TYPES = {"stdio": STDIO_KEYS, "http": HTTP_KEYS, "streamable-http": HTTP_KEYS, "streamableHttp": HTTP_KEYS}
MAX_SERVERS = 32


@dataclass(frozen=True)
class StdioServer:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # the config's own, expanded
    cwd: Path | None = None

    @property
    def where(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class HttpServer:
    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)  # expanded; never shown

    @property
    def where(self) -> str:
        return self.url


McpServerConfig = StdioServer | HttpServer


def read_configs(paths: tuple[Path, ...], only: tuple[str, ...] = ()) -> list[McpServerConfig]:
    """Every server of every ``--mcp`` file (a name once across them), or those ``only`` names."""
    servers: dict[str, McpServerConfig] = {}
    for path in paths:
        for server in read_config(path):
            if server.name in servers:
                raise UsageError(f"--mcp {path}: server '{server.name}' is already configured in another --mcp file")
            servers[server.name] = server
    unknown = [name for name in only if name not in servers]
    if unknown:
        known = ", ".join(servers) or "none"
        raise UsageError(f"--mcp-only {unknown[0]}: no such server in the --mcp files (they configure: {known})")
    return [servers[name] for name in only] if only else list(servers.values())


def read_config(path: Path) -> list[McpServerConfig]:
    try:
        data = bounded_json.loads(read_text(path))
    except FileNotFoundError:
        raise UsageError(f"--mcp {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--mcp {path}: a directory, not a file") from None
    except OSError as exc:
        raise UsageError(f"--mcp {path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--mcp {path}: not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise UsageError(f"--mcp {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or set(data) != {"mcpServers"} or not isinstance(data["mcpServers"], dict):
        raise UsageError(f"--mcp {path}: expected {{\"mcpServers\": {{\"NAME\": {{\"command\": …}}, …}}}}")
    entries = data["mcpServers"]
    if not entries:
        raise UsageError(f"--mcp {path}: mcpServers is empty")
    if len(entries) > MAX_SERVERS:
        raise UsageError(f"--mcp {path}: {len(entries)} servers, over the {MAX_SERVERS} localchat starts")
    return [server_of(path, name, entry) for name, entry in entries.items()]


def server_of(path: Path, name: str, entry: Any) -> McpServerConfig:
    def wrong(key: str, why: str) -> UsageError:
        return UsageError(f"--mcp {path}: server '{_shown(name)}': {key} {why}")

    if not name or len(name) > 64 or any(not c.isprintable() for c in name):
        raise UsageError(f"--mcp {path}: a server name must be 1 to 64 printable characters, not {_shown(name)!r}")
    if not isinstance(entry, dict):
        raise wrong("its entry", "must be an object")
    kind = entry.get("type", "http" if "url" in entry else "stdio")
    if kind not in TYPES:
        raise wrong("type", f"must be stdio or http, not {_shown(kind)!r}")
    unknown = sorted(set(entry) - TYPES[kind])
    if unknown:
        raise wrong(unknown[0], f"is not a key of a{'n http' if kind != 'stdio' else ' stdio'} server "
                                f"(it takes: {', '.join(sorted(TYPES[kind]))})")
    if kind == "stdio":
        return _stdio(name, entry, wrong)
    return _http(name, entry, wrong)


def _stdio(name: str, entry: dict, wrong) -> StdioServer:
    command, args, env, cwd = entry.get("command"), entry.get("args", []), entry.get("env", {}), entry.get("cwd")
    if not isinstance(command, str) or not command.strip():
        raise wrong("command", "must be a program to run (a non-empty string)")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise wrong("args", "must be a list of strings")
    if any("\0" in a for a in [command, *args]):
        raise wrong("args", "hold a NUL character")
    env = _strings(env, "env", wrong)
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise wrong("cwd", "must be a directory (a string)")
    directory = Path(expanded(cwd, "cwd", wrong)).expanduser() if cwd else None
    if directory is not None and not directory.is_dir():
        raise wrong("cwd", f"is not a directory ({directory})")
    return StdioServer(name=name, command=command, args=tuple(args), cwd=directory,
                       env={k: expanded(v, f"env.{k}", wrong) for k, v in env.items()})


def _http(name: str, entry: dict, wrong) -> HttpServer:
    import httpx

    url = entry.get("url")
    if not isinstance(url, str) or not url:
        raise wrong("url", "must be the server's http(s) URL (a string)")
    url = expanded(url, "url", wrong)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        raise wrong("url", "is not a URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise wrong("url", f"must be an http:// or https:// URL, not {parsed.scheme or 'none'}://")
    if parsed.userinfo:
        raise wrong("url", "holds credentials: put them in headers, from ${VAR} (the URL is not shown)")
    headers = _strings(entry.get("headers", {}), "headers", wrong)
    return HttpServer(name=name, url=url, headers={k: expanded(v, f"headers.{k}", wrong) for k, v in headers.items()})


def _strings(value: Any, key: str, wrong) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise wrong(key, "must be an object of strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v or "\n" in v for k, v in value.items()):
        raise wrong(key, "holds an empty name, '=' in a name, a NUL or a line break")
    return value


def expanded(text: str, key: str, wrong) -> str:
    """``text`` with each ``${VAR}`` replaced by the variable's value; one not set is refused."""
    def value(match: re.Match) -> str:
        if match[1] not in os.environ:
            raise wrong(key, f"uses ${{{match[1]}}}, which is not set in the environment")
        return os.environ[match[1]]

    return VARIABLE.sub(value, text)


def _shown(text: Any) -> str:
    text = str(text)
    return text if len(text) <= 40 else text[:39] + "…"
