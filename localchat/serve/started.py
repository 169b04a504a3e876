"""``localchat serve`` started in a subprocess by a script or a test, known to be ready at its
"Ctrl+C stops the server" line, and stopped whole (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx

from localchat.backends.http import shared_ssl_context
from localchat.server.launch import free_port

READY_LINE = "Ctrl+C stops the server"


class StartedServe:
    """``serve`` on a free loopback port with its own data directory ``home``; ``log`` is where its
    stderr goes (a file), or None to read it from ``proc.stderr``."""

    def __init__(self, home: Path, *args: str, log: IO[str] | None = None, env: dict[str, str] | None = None):
        self.home, self.port = home, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", str(self.port), *args],
                                     stdout=subprocess.PIPE, stderr=log or subprocess.PIPE, text=True,
                                     env=os.environ | {"LOCALCHAT_HOME": str(home), "COLUMNS": "200"} | (env or {}))
        self.out = ""

    def wait_ready(self) -> bool:
        """Read its output up to the ready line; False when it ended first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out += line
            if READY_LINE in line:
                return True
        return False

    def held(self) -> list[dict]:
        return httpx.get(self.url + "/localchat/ps", timeout=10, verify=shared_ssl_context()).json()["models"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
