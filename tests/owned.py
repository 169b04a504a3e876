"""The processes this test run started, and only those.

Each pytest worker puts ``MARK=<its own value>`` in its environment; every process a test starts
inherits it (an MCP server, whose environment localchat keeps minimal, gets it through its
config's ``env``: see ``test_mcp.config``), and so does whatever those processes start, even in a
session of their own. Tests find, count and kill processes by that mark, never by name: a user
running the suite may have MCP servers, ``sleep``s and mlx_lm servers of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

MARK = "LOCALCHAT_TEST_RUN"
RUN = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # one value a worker (each imports this module itself)
os.environ[MARK] = RUN
TAG = f"{MARK}={RUN}".encode()


@dataclass(frozen=True)
class Owned:
    pid: int
    parent: int
    command: str
    session: int = 0


def owned(*needles: str) -> list[Owned]:
    """Live processes (zombies left out) carrying this worker's mark, whose command line holds one
    of ``needles`` (any, when none is given); the test process itself is never among them."""
    found = _from_proc() if Path("/proc/self/environ").exists() else _from_ps()
    return [p for p in found if p.pid != os.getpid() and (not needles or any(n in p.command for n in needles))]


def kill_owned(*needles: str) -> list[Owned]:
    """SIGKILL this run's processes that match; what was killed."""
    left = owned(*needles)
    for process in left:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def children_of(pid: int, *needles: str) -> list[int]:
    """The live children of a process a test started, matching ``needles``."""
    return [p.pid for p in owned(*needles) if p.parent == pid]


def unmarked_environment() -> dict[str, str]:
    """The environment without the mark: for a process that must look like a user's own."""
    return {k: v for k, v in os.environ.items() if k != MARK}


def _from_proc() -> list[Owned]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if TAG not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if stat[0] != "Z":
            found.append(Owned(int(entry.name), int(stat[1]), command, int(stat[3])))
    return found


def _from_ps() -> list[Owned]:
    """macOS: ``ps -E`` appends each process's environment to its command (one's own user's)."""
    out = subprocess.run(["ps", "-E", "-ww", "-o", "pid=,ppid=,sess=,stat=,command="], capture_output=True,
                         text=True, check=False).stdout if sys.platform == "darwin" else ""
    found = []
    for line in out.splitlines():
        pid, parent, session, state, command = (line.split(None, 4) + [""] * 5)[:5]
        if TAG.decode() in command.split() and not state.startswith("Z"):
            found.append(Owned(int(pid), int(parent), command, int(session) if session.isdigit() else 0))
    return found


def wait_until_localchat_runs(pid: int, seconds: float = 30.0) -> None:
    """Until localchat's own first line has run in ``pid``: its entry point catches SIGTERM before
    anything else. A signal before that lands in the interpreter's own start (``site``, a
    ``sitecustomize``), which no program can take over; "at any moment" counts from here."""
    import time

    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            caught = next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return  # gone already: the caller's assertions say what happened
        if int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.002)
    raise AssertionError(f"process {pid} never reached localchat's entry point")
