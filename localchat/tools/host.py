"""The chat's side of the tool process (``worker``): start it, ask it for one call at a time with a
time limit, stop it. A call past its limit stops the process (and all it started); the next call
starts a new one.

What comes back is checked line by line: the nonce this host gave, then the exact shape of a ready
message or of a call's answer. Anything else (a tool writing to the channel, a forged message, a
second process announcing its tools) stops the process, in one line naming the tool files. The
tool process starts without localchat's secrets in its environment.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localchat import bounded_json
from localchat.errors import LocalchatError, UsageError
from localchat.processes import child_preexec, kill_group
from localchat.tools.schema import NAME
from localchat.tools.settings import DEFAULT_TOOL_TIMEOUT_S

MAX_ANSWER_BYTES = 1 << 20  # a call's answer is at most ~16,000 characters of result and 4,000 printed
SECRET_VARIABLES = ("LOCALCHAT_API_KEY", "LOCALCHAT_GATEWAY_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "HF_TOKEN",
                    "HUGGING_FACE_HUB_TOKEN")  # the keys localchat (and the SDKs and the Hub client it uses) read
MIN_SECRET_CHARS = 8  # shorter "keys" would cut ordinary words out of results


def known_secrets(hidden: list[str]) -> tuple[str, ...]:
    """The secrets a tool result must never carry on: the keys given (``--api-key``) and those in
    the variables localchat reads."""
    found = [*hidden, *(os.environ.get(name, "") for name in SECRET_VARIABLES)]
    return tuple(dict.fromkeys(s for s in found if len(s) >= MIN_SECRET_CHARS))


def tool_files(paths: list[Path]) -> list[Path]:
    """``--tools`` files that can be offered: existing, readable Python files, each once (what they
    define is checked when they are imported, in the tool process)."""
    seen: set[Path] = set()
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--tools {path}: no such file" if not path.exists() else f"--tools {path}: not a file")
        if path.suffix != ".py":
            raise UsageError(f"--tools {path}: not a Python file (FILE.py)")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise UsageError(f"--tools {path}: cannot be read ({exc.strerror})") from None
        if path.resolve() in seen:
            raise UsageError(f"--tools {path} is given twice")
        seen.add(path.resolve())
    return paths


def tool_environment(hidden: list[str]) -> dict[str, str]:
    """localchat's environment less its own secrets: the API key's variable, and any variable
    that holds one of ``hidden`` (a key given with --api-key)."""
    keys = [h for h in hidden if h]
    return {name: value for name, value in os.environ.items()
            if name not in SECRET_VARIABLES and not any(key in value for key in keys)}


class ToolTimeout(LocalchatError):
    """A call (or the tool files' import) did not finish within its time limit."""


class ToolProcessError(LocalchatError):
    """The tool process ended, or wrote something that is not its answer."""


@dataclass(frozen=True)
class ToolOutput:
    """One call's answer: what the model reads, and what is only the user's to see."""

    ok: bool
    content: str
    seconds: float
    printed: str = ""  # what the tool printed beside its result (shown to the user, not the model)
    stopped: int = 0  # processes the call left running, stopped when it returned


class ToolHost:
    """The running tool process for ``paths``; ``specs`` are the tools it offers."""

    def __init__(self, paths: list[Path], timeout_s: float = DEFAULT_TOOL_TIMEOUT_S, *, hidden: Sequence[str] = ()):
        self.paths = [str(p) for p in tool_files(paths)]
        self.name = ", ".join(Path(p).name for p in self.paths)
        self.timeout_s = timeout_s
        self._hidden = list(hidden)
        self._process: subprocess.Popen | None = None
        self._nonce = ""
        self._pending = b""  # what the process wrote after its last whole line
        self._origins: dict[str, str] = {}
        self._lock = threading.Lock()  # one call at a time (load's users share the process)
        self.specs: list[dict[str, Any]] = self._start()

    def _start(self) -> list[dict[str, Any]]:
        """A new process; its tools' descriptions, or a usage error naming what could not be
        described (the files are the user's input)."""
        self._nonce, self._pending = secrets.token_hex(16), b""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "localchat.tools.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
            stderr=subprocess.DEVNULL, start_new_session=True, env=tool_environment(self._hidden),
            preexec_fn=child_preexec())
        try:
            self._send({"files": self.paths, "nonce": self._nonce})
            ready = self._answer(f"importing {', '.join(self.paths)}")
        except LocalchatError as exc:
            self.close()
            raise UsageError(f"--tools: {exc}") from None
        except BaseException:
            self.close()
            raise
        if "refused" in ready:
            self.close()
            raise UsageError(f"--tools {ready['refused']}")
        self._origins = ready["origins"]
        return ready["tools"]

    def origin(self, name: str) -> str:
        """The file a tool comes from (``/tools``)."""
        return self._origins.get(name, self.name)

    def refresh(self) -> bool:
        """A file's tools do not change while the chat runs."""
        return False

    def call(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """One call's answer; ``ToolTimeout`` when it runs past the limit, ``ToolProcessError`` when
        the process ends or answers out of turn (it is stopped either way). Ctrl+C while waiting
        stops the process too, then goes on up."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                self._send({"name": name, "arguments": arguments})
                done = self._answer(f"the tool {name}")
            except BaseException:
                self.close()
                raise
            return ToolOutput(ok=done["ok"], content=done["content"], seconds=done["seconds"],
                              printed=done["printed"], stopped=done["stopped"])

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self._process.stdin if self._process is not None else None
        if stdin is None:
            raise LocalchatError("the tools' process is not running")
        try:
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()
        except OSError:  # the process has ended: its exit is read as the answer
            pass

    def _answer(self, what: str) -> dict[str, Any]:
        """The next line the process answers, read as it comes (a line that never ends cannot hold
        the chat past the time limit, nor fill its memory)."""
        deadline = time.monotonic() + self.timeout_s
        process = self._process
        if process is None or process.stdout is None:
            raise LocalchatError(f"{what}: the tools' process is not running")
        fd = process.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ToolTimeout(f"{what} did not finish within {self.timeout_s:g}s (--tool-timeout); it was "
                                  "stopped, with every process it started")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                code = process.wait()
                self.close()
                raise ToolProcessError(f"{what}: the tool process ended (exit {code})")
            self._pending += data
            if len(self._pending) > MAX_ANSWER_BYTES:
                break
        line, _, self._pending = self._pending.partition(b"\n")
        return self._checked(line, what)

    def _checked(self, line: bytes, what: str) -> dict[str, Any]:
        """The message on ``line`` when it is one this host expects; else the process is stopped."""
        try:
            message = bounded_json.loads(line) if len(line) <= MAX_ANSWER_BYTES else None
        except ValueError:
            message = None
        if not isinstance(message, dict) or message.get("nonce") != self._nonce or not _well_formed(message):
            self.close()
            raise ToolProcessError(f"{what}: the tool process wrote something that is not its answer (a tool in "
                                   f"{self.name} writes to localchat's channel?); it was stopped")
        return message

    def close(self) -> None:
        if self._process is not None:
            kill_group(self._process)
            self._process = None


def _well_formed(message: dict[str, Any]) -> bool:
    """A ready message (``tools`` or ``refused``) or a call's answer, field by field."""
    if "refused" in message:
        return isinstance(message["refused"], str)
    if "tools" in message:
        origins = message.get("origins")
        return isinstance(message["tools"], list) and all(_is_spec(s) for s in message["tools"]) \
            and isinstance(origins, dict) and all(isinstance(v, str) for v in origins.values())
    return (isinstance(message.get("ok"), bool) and isinstance(message.get("content"), str)
            and isinstance(message.get("seconds"), (int, float)) and isinstance(message.get("printed"), str)
            and isinstance(message.get("stopped"), int))


def _is_spec(spec: Any) -> bool:
    function = spec.get("function") if isinstance(spec, dict) else None
    return (isinstance(function, dict) and isinstance(function.get("name"), str) and NAME.fullmatch(function["name"])
            is not None and isinstance(function.get("description"), str)
            and isinstance(function.get("parameters"), dict))
