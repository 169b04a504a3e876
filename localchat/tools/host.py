"""The chat's side of the tool process (``worker``): start it, ask it for one call at a time with a
time limit, stop it. A call past its limit kills the process; the next call starts a new one."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from localchat.errors import LocalchatError, UsageError

DEFAULT_TOOL_TIMEOUT_S = 30.0


def tool_files(paths: list[Path]) -> list[Path]:
    """``--tools`` files that can be offered: existing, readable Python files (what they define is
    checked when they are imported, in the tool process)."""
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--tools {path}: no such file" if not path.exists() else f"--tools {path}: not a file")
        if path.suffix != ".py":
            raise UsageError(f"--tools {path}: not a Python file (FILE.py)")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise UsageError(f"--tools {path}: cannot be read ({exc.strerror})") from None
    return paths


class ToolTimeout(LocalchatError):
    """A call (or the tool files' import) did not finish within its time limit."""


class ToolHost:
    """The running tool process for ``paths``; ``specs`` are the tools it offers."""

    def __init__(self, paths: list[Path], timeout_s: float = DEFAULT_TOOL_TIMEOUT_S):
        self.paths = [str(p) for p in tool_files(paths)]
        self.timeout_s = timeout_s
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one call at a time (load's users share the process)
        self.specs: list[dict[str, Any]] = self._start()

    def _start(self) -> list[dict[str, Any]]:
        """A new process; its tools' descriptions, or a usage error naming what could not be
        described (the files are the user's input)."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "localchat.tools.worker", json.dumps(self.paths)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            ready = self._answer(f"importing {', '.join(self.paths)}")
        except (ToolTimeout, LocalchatError) as exc:
            self.close()
            raise UsageError(f"--tools: {exc}") from None
        if "refused" in ready:
            self.close()
            raise UsageError(f"--tools {ready['refused']}")
        return ready["tools"]

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``{"ok", "content", "seconds"}`` of one call; ``ToolTimeout`` when it runs past the limit
        (the process is stopped). Ctrl+C while waiting stops the process too, then goes on up."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                self._process.stdin.write((json.dumps({"name": name, "arguments": arguments}) + "\n").encode())
                self._process.stdin.flush()
                return self._answer(f"the tool {name}")
            except BaseException:
                self.close()
                raise

    def _answer(self, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        stdout = self._process.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ToolTimeout(f"{what} did not finish within {self.timeout_s:g}s (--tool-timeout); it was stopped")
            ready, _, _ = select.select([stdout], [], [], min(left, 0.5))
            if ready:
                line = stdout.readline()
                if not line:
                    code = self._process.wait()
                    self._process = None
                    raise LocalchatError(f"{what}: the tool process ended (exit {code})")
                return json.loads(line)

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
