"""``localchat serve`` as a test starts it: a subprocess with its own data directory, up to "Ctrl+C
stops the server", its log (stderr) kept; and whether a process a test started has ended."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx

from localchat.serve.started import StartedServe

HELLO = [{"role": "user", "content": "Remember the code harbor 17. Reply only OK."}]


class Serve(StartedServe):
    """``localchat serve`` in a subprocess, up to "Ctrl+C stops the server"; its log (stderr) kept."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None):
        super().__init__(home, *args, env=env)
        self.log: list[str] = []
        threading.Thread(target=self._read_log, daemon=True).start()
        ready = self.wait_ready()
        assert ready and "ready" in self.out, self.out + "\n".join(self.log)

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def held_names(self) -> set[str]:
        return {row["model"] for row in self.held()}

    def ask(self, model: str, **extra) -> httpx.Response:
        return httpx.post(self.url + "/v1/chat/completions", timeout=120,
                          json={"model": model, "messages": HELLO, "max_tokens": 8, **extra})

    def wait_log(self, text: str, seconds: float = 30) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = next((line for line in self.log if text in line), None)
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not in the log: {self.log}")


def ended(pid: int) -> bool:
    """Gone, or a zombie no one has reaped yet (this machine's PID 1 may not): asked of the kernel
    (``kill -0``), then the state read from ``/proc`` or, where there is none (macOS), from ``ps``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return process_state(pid) in ("Z", "X", "")


def process_state(pid: int) -> str:
    """The process's state letter (``R``, ``S``, ``T`` stopped, ``Z`` zombie), "" when it is gone."""
    if Path("/proc/self/stat").exists():
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return ""
        return text[text.rfind(")") + 2:].split()[0]
    shown = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return shown.stdout.strip()[:1]


def wait_ended(pid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while not ended(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return ended(pid)


