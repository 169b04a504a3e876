"""``localchat chat`` in a pseudo-terminal (pexpect), as a user at a terminal runs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect

PROMPT = ">>>"  # prompt_toolkit draws ">>> " with a cursor move for the space


def spawn(*args: str, home: Path | str, color: bool = False, path: str = "/usr/bin:/bin") -> pexpect.spawn:
    """The REPL, once its first prompt is drawn; its data directory is ``home``."""
    env = {"HF_HUB_OFFLINE": "1", "PATH": path, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1",
           "LOCALCHAT_HOME": str(home), "COLUMNS": "200", **({} if color else {"NO_COLOR": "1"})}
    child = pexpect.spawn(sys.executable, ["-m", "localchat", "chat", *args], encoding="utf-8", timeout=60,
                          dimensions=(40, 200), env=env)
    child.expect_exact(PROMPT)
    return child


def send(child: pexpect.spawn, line: str) -> None:
    """Type a line and Enter (prompt_toolkit reads a carriage return as Enter)."""
    child.send(line + "\r")


def quit(child: pexpect.spawn) -> None:
    """/quit, and once more when it says turns were not saved; the exit code must be 0."""
    send(child, "/quit")
    if child.expect([pexpect.EOF, "again leaves without saving"]) == 1:
        child.expect_exact(PROMPT)
        send(child, "/quit")
        child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
