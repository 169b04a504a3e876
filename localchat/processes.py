"""The processes localchat starts, and all that they start: stopped together, whatever ends them.

Every child runs in a process group of its own (``start_new_session``), so stopping it means its
whole group: SIGTERM, a grace period, SIGKILL, then waiting until no member is left (a launcher's
ranks, a tool's ``sleep``, a server's helpers outlive their leader by a moment). On Linux a child
also dies with localchat (``die_with_parent``); ``watch_parent`` is the same promise kept from
inside a process, on any system, for processes localchat does not start itself (ranks started by
``mlx.launch``) or that must take their own children with them (the tool process).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

GRACE_S = 5.0
POLL_S = 0.05
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

SERVE_PID = "LOCALCHAT_SERVE_PID"  # what an engine child of ``serve`` watches: it ends when serve has gone
SERVED_ID = "LOCALCHAT_SERVED_ID"  # the id ``serve`` serves an engine's model by: the engine writes it in replies


def die_with_parent(death_signal: int = signal.SIGTERM) -> None:
    """``preexec_fn`` of a child (Linux): ``death_signal`` when localchat ends, however it ends."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, death_signal)
    except (OSError, AttributeError):
        pass


def become_subreaper() -> bool:
    """Linux: what this process's descendants leave orphaned (a double fork, a ``setsid``) becomes
    its child, not init's, so it can stop them; False where there is no such thing (macOS)."""
    if sys.platform != "linux":
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_preexec(death_signal: int = signal.SIGTERM) -> Callable[[], None] | None:
    """What a child runs before it starts: the parent-death signal where there is one. An engine
    child gets SIGKILL: a child that is stopped (SIGSTOP, Ctrl+Z) takes no other signal until it
    is continued, and would outlive a front killed meanwhile, holding its model's memory."""
    import functools

    return functools.partial(die_with_parent, death_signal) if sys.platform == "linux" else None


def _stat_fields(pid: str) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) from ``/proc/PID/stat`` (the name may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _table() -> list[tuple[int, str, int, int]]:
    """(pid, state, parent, group) of every process this user can see; zombies included."""
    if Path("/proc/self/stat").exists():
        rows = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
                rows.append((int(entry), *fields))
        return rows
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=,stat=,ppid=,pgid="], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0].isdigit():
            rows.append((int(parts[0]), parts[1][:1], int(parts[2]), int(parts[3])))
    return rows


def group_members(pgid: int) -> list[int]:
    """The living processes of a process group (a zombie has already ended)."""
    return [pid for pid, state, _, group in _table() if group == pgid and state != "Z"]


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid``, whatever group or session it moved to."""
    children: dict[int, list[int]] = {}
    for child, state, parent, _ in _table():
        if state != "Z":
            children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def parent_of(pid: int) -> int | None:
    """The parent of a living process, or None."""
    found = [parent for child, state, parent, _ in _table() if child == pid and state != "Z"]
    return found[0] if found else None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(str(pid)) if Path("/proc/self/stat").exists() else None
    return fields is None or fields[0] != "Z"


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_pids(pids: list[int], timeout_s: float = GRACE_S) -> None:
    """SIGKILL to each, then wait until each has ended: the signal is delivered at once, the death
    comes a moment later (longer on a busy machine), and what follows must not see them alive."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until the group has no living member; True when it has none."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def stop_group(process: subprocess.Popen, grace_s: float = GRACE_S) -> int | None:
    """Stop ``process`` (a group leader) and its whole group: SIGTERM, then SIGKILL after
    ``grace_s``; returns only once no member is left. The leader's exit code."""
    pgid = process.pid
    escaped = descendants(pgid)  # those that left the group (setsid) are still its own
    deadline = time.monotonic() + grace_s
    signal_group(pgid, signal.SIGTERM)  # the leader, or what it left when it has exited already
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    wait_group_gone(pgid, max(0.0, deadline - time.monotonic()))
    signal_group(pgid, signal.SIGKILL)
    kill_pids(escaped + descendants(pgid))
    process.wait()
    wait_group_gone(pgid, grace_s)
    return process.returncode


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to ``process``'s group and to everything below it, at once; reaped, and waited for."""
    escaped = descendants(process.pid)
    signal_group(process.pid, signal.SIGKILL)
    kill_pids(escaped)
    process.wait()
    wait_group_gone(process.pid, GRACE_S)


def stray_members() -> list[int]:
    """The other living members of this process's own group, and the processes below it: what a
    tool left running. A process that does not lead its group (run by hand from a shell, not
    started by localchat) owns no one in it: only what is below it."""
    me, group = os.getpid(), own_group()
    return sorted({*(group_members(group) if group is not None else []), *descendants(me)} - {me})


def own_group() -> int | None:
    """This process's group, when this process leads it (localchat starts its guards and workers so)."""
    return os.getpgrp() if os.getpgrp() == os.getpid() else None


def reap_children() -> None:
    """Collect the exit of every ended child, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def watch_parent(on_gone: Callable[[], None], *, also: int | None = None, every_s: float = 0.5) -> None:
    """A daemon thread that calls ``on_gone`` once this process's parent has gone (it was
    re-parented), or the process ``also`` has ended."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent or (also and not alive(also)):
                on_gone()
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def resident_bytes(pid: int) -> int | None:
    """A process's resident memory (``VmRSS`` on Linux, ``ps`` elsewhere); None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None
    except FileNotFoundError:
        if sys.platform == "linux":
            return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
        return int(out.stdout.strip()) * 1024 if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
