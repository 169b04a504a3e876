"""The process that runs the user's tools (``python -m localchat.tools.worker``).

Its first line on stdin names the tool files and a nonce; then it imports the files (the user's own
code, imported as such), describes their public functions and runs one call at a time, each
request a JSON line on stdin. Answers go one JSON line each, tagged with the nonce, to a private
duplicate of the original stdout that nothing the tools start inherits; fd 1 and 2 then lead
nowhere, and what a tool prints is captured, capped and sent apart from its result. The chat
(``host``) refuses any line without the nonce or of the wrong shape, so a tool that writes to the
channel cannot forge an answer. A process the tool forks that comes back into this module exits at
once; what a call leaves running is stopped when it returns, and everything the tools started
ends with this process, and this process with the chat (``processes.watch_parent``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from localchat.processes import kill_pids, reap_children, stray_members, watch_parent
from localchat.tools.schema import ToolDefinitionError, describe

MAX_RESULT_CHARS = 16_000  # what goes back to the model of a tool's result
MAX_PRINTED_CHARS = 4_000  # what the user is shown of what a call printed
MAX_TOOLS = 128  # what an OpenAI-style request takes (the MCP hub offers as many at most)


class CappedText:
    """A write-only text buffer that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int = MAX_RESULT_CHARS):
        self.limit, self.kept, self.dropped = limit, 0, 0
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        room = max(0, self.limit - self.kept)
        self.parts.append(text[:room])
        self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - room)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        cut = f"\n[… {self.dropped:,} more characters cut]" if self.dropped else ""
        return "".join(self.parts) + cut


def capped(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    buffer = CappedText(limit)
    buffer.write(text)
    return buffer.text()


def load_functions(paths: list[str]) -> dict[str, Callable[..., Any]]:
    """Every public function defined in the files, by name; a clash of names is refused."""
    functions: dict[str, Callable[..., Any]] = {}
    owners: dict[str, Path] = {}
    for index, text in enumerate(paths):
        path = Path(text)
        for name, function in _public_functions(_imported(path, index)).items():
            if name in functions:
                where = "earlier in the same file" if owners[name] == path else f"from {owners[name]}"
                raise ToolDefinitionError(f"{path}: '{name}' is already a tool {where}")
            functions[name], owners[name] = function, path
    return functions


def _imported(path: Path, index: int) -> Any:
    spec = importlib.util.spec_from_file_location(f"localchat_tools_{index}_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ToolDefinitionError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise ToolDefinitionError(f"{path}: line {exc.lineno}: {exc.msg}") from None
    except BaseException as exc:  # the user's code: whatever it raises, or exit(), is its failure
        raise ToolDefinitionError(f"{path}: importing it failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return module


def _public_functions(module: Any) -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {name: value for name, value in vars(module).items()
             if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")}
    if not found:
        raise ToolDefinitionError(f"{module.__file__}: it defines no public function to offer as a tool")
    return found


def _described(functions: dict[str, Callable[..., Any]], paths: list[str]) -> list[dict[str, Any]]:
    """Each function's tool entry; a refusal names the file, and how to keep a helper out."""
    specs = []
    for name, function in functions.items():
        try:
            specs.append(describe(function, name))
        except ToolDefinitionError as exc:
            where = inspect.getsourcefile(function) or (paths[0] if len(paths) == 1 else "a --tools file")
            raise ToolDefinitionError(f"{where}: {exc}; a helper that is not a tool: name it _{name}") from None
    return specs


def as_text(value: Any) -> str:
    """A tool's return value as the model reads it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def call(function: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one call: its result as text (what it returned; what it printed when it returned
    nothing), capped; an exception as the result's error; what it printed beside a result."""
    printed = CappedText()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            value = function(**arguments)
        content, ok = (printed.text() if value is None else as_text(value)), True
    except BaseException as exc:  # the user's code: an exception (or exit()) is what the model hears
        content, ok = f"error: {type(exc).__name__}: {_first_line(exc)}", False
    aside = printed.text() if ok and value is not None else ""
    return {"ok": ok, "content": capped(content), "seconds": time.perf_counter() - started,
            "printed": capped(aside, MAX_PRINTED_CHARS)}


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip()
    except Exception:  # an exception whose str() fails (e.g. an int too long to print)
        return "(its message cannot be shown)"
    return text.splitlines()[0][:500] if text else "(no message)"


class Channel:
    """The answers' line: a private duplicate of the original stdout, used by this process only
    (a fork of it that comes back here exits), each answer tagged with the nonce."""

    def __init__(self, nonce: str):
        self.nonce, self.owner = nonce, os.getpid()
        self._file = os.fdopen(os.dup(1), "w", encoding="utf-8")  # not inherited by what a tool starts
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.close(quiet)

    def guard(self) -> None:
        """A process the tool forked, come back into the worker's code: it ends here, silently."""
        if os.getpid() != self.owner:
            os._exit(0)

    def answer(self, message: dict[str, Any]) -> None:
        self.guard()
        self._file.write(json.dumps({**message, "nonce": self.nonce}) + "\n")  # ASCII: any text travels
        self._file.flush()


def stop_strays() -> int:
    """Stop what the call left running (its processes in this group, or below this one)."""
    strays = stray_members()
    kill_pids(strays)
    reap_children()
    return len(strays)


def private_requests() -> TextIO:
    """The requests' line, a private duplicate of stdin; fd 0 then reads nothing (a tool calling
    ``input()`` gets end of file, never the next request)."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    empty = os.open(os.devnull, os.O_RDONLY)
    os.dup2(empty, 0)
    os.close(empty)
    return requests


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the chat's: it stops this process itself

    def chat_gone(*_: Any) -> None:  # what the tools started goes first, then this process
        stop_strays()
        os._exit(1)

    signal.signal(signal.SIGTERM, chat_gone)  # the parent-death signal (Linux), or a plain SIGTERM
    watch_parent(chat_gone)  # any system: the chat is gone
    requests = private_requests()
    first = json.loads(requests.readline())
    channel = Channel(first["nonce"])
    try:
        functions = load_functions(first["files"])
        channel.guard()
        if len(functions) > MAX_TOOLS:
            raise ToolDefinitionError(f"{', '.join(first['files'])}: {len(functions):,} public functions, over the "
                                      f"{MAX_TOOLS} tools a request can offer (name helpers _like_this)")
        specs = _described(functions, first["files"])
    except ToolDefinitionError as exc:
        channel.answer({"refused": str(exc)})
        return
    origins = {name: Path(inspect.getsourcefile(function) or "").name for name, function in functions.items()}
    channel.answer({"tools": specs, "origins": origins, "stopped": stop_strays()})
    for line in requests:
        request = json.loads(line)
        done = call(functions[request["name"]], request["arguments"])
        channel.guard()
        channel.answer({**done, "stopped": stop_strays()})
    stop_strays()


if __name__ == "__main__":
    main()
