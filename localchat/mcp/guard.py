"""An MCP server's process that never outlives localchat: ``python -m localchat.mcp.guard COMMAND ARGS…``.

The SDK's stdio transport starts this module as the leader of a new session, with the server's
pipes. It starts the server with exactly the environment localchat allows (the config's ``env``,
named in ``LOCALCHAT_MCP_KEEP``, over ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR``: never the whole
environment, never localchat's API key), writes its own pid where localchat asked, and waits. When
the server exits, whatever it left in the group is stopped too; when localchat has gone, even by
SIGKILL, the whole group goes at once. On Linux the guard is a subreaper: what the server starts in a
session of its own (``setsid``, a double fork) stays below the guard and goes with it too (macOS has
no such thing: there such a process can outlive the chat). The SDK's SIGTERM to the group reaches
the server itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

from localchat.processes import (
    become_subreaper,
    descendants,
    kill_pids,
    own_group,
    signal_group,
    stray_members,
    watch_parent,
)

BASE = ("PATH", "HOME", "LANG", "TMPDIR")
KEEP, PIDFILE = "LOCALCHAT_MCP_KEEP", "LOCALCHAT_MCP_PIDFILE"


def server_environment() -> dict[str, str]:
    keep = json.loads(os.environ.get(KEEP, "[]"))
    return {name: os.environ[name] for name in (*BASE, *keep) if name in os.environ}


def write_pid(path: str) -> None:
    """The guard's pid where localchat asked, readable by the user alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))


def forget(pidfile: str | None) -> None:
    """The pid file goes with the guard, however the guard ends (localchat may be gone already)."""
    if pidfile:
        with contextlib.suppress(OSError):
            os.unlink(pidfile)


def orphaned(pidfile: str | None) -> None:
    """localchat is gone (even by SIGKILL): the pid file goes, then whatever the server started in
    sessions of its own (ours, as their subreaper), then the whole group."""
    forget(pidfile)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if (group := own_group()) is not None:  # (a guard run by hand leads no group: its shell's is not its own)
        signal_group(group, signal.SIGKILL)


def main() -> None:
    pidfile = os.environ.get(PIDFILE)
    if pidfile:
        write_pid(pidfile)
    become_subreaper()  # Linux: a double fork or a setsid cannot take a server's children out of reach
    signal.signal(signal.SIGTERM, lambda *_: None)  # a handler, not SIG_IGN: the server gets the default back
    try:
        server = subprocess.Popen(sys.argv[1:], env=server_environment())
    except OSError as exc:
        sys.stderr.write(f"cannot start {sys.argv[1]!r}: {exc.strerror or exc}\n")
        forget(pidfile)
        sys.exit(127)
    watch_parent(lambda: orphaned(pidfile), every_s=0.2)
    code = server.wait()
    kill_pids(stray_members())  # what the server left running goes with it
    forget(pidfile)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
