"""The process that runs the user's tools (``python -m localchat.tools.worker FILES_JSON``).

It imports the tool files (the user's own code, imported as such), describes their public
functions, then runs one call at a time. Requests come one JSON line each on stdin; answers go one
JSON line each on the original stdout, which nothing else may write to: the tools' own output
(``print``, or C code writing to fd 1 and 2) is captured, capped, or thrown away. In its own
process a tool that hangs can be stopped (the chat kills this process and starts another for the
next call), an exception is a result, and Ctrl+C belongs to the chat alone.
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

from localchat.tools.schema import ToolDefinitionError, describe

MAX_RESULT_CHARS = 16_000  # what goes back to the model of a tool's result (and of what it printed)


class CappedText:
    """A write-only text buffer that keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int = MAX_RESULT_CHARS):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

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


def load_functions(paths: list[str]) -> dict[str, Callable[..., Any]]:
    """Every public function defined in the files, by name; a clash of names is refused."""
    functions: dict[str, Callable[..., Any]] = {}
    for index, text in enumerate(paths):
        path = Path(text)
        for name, function in _public_functions(_imported(path, index)).items():
            if name in functions:
                raise ToolDefinitionError(f"{path}: '{name}' is already a tool from another --tools file")
            functions[name] = function
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
    found = {name: value for name, value in vars(module).items()
             if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_")}
    if not found:
        raise ToolDefinitionError(f"{module.__file__}: it defines no public function to offer as a tool")
    return found


def as_text(value: Any) -> str:
    """A tool's return value as the model reads it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def call(function: Callable[..., Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one call: its result as text (what it returned; what it printed when it returned nothing),
    capped; an exception as the result's error."""
    printed = CappedText()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            value = function(**arguments)
        content, ok = (printed.text() if value is None else as_text(value)), True
    except BaseException as exc:  # the user's code: an exception (or exit()) is what the model hears
        content, ok = f"error: {type(exc).__name__}: {_first_line(exc)}", False
    capped = CappedText()
    capped.write(content)
    return {"ok": ok, "content": capped.text(), "seconds": time.perf_counter() - started}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else "(no message)"


def _channel() -> TextIO:
    """The answers' channel (the original stdout); fd 1 and 2 then lead nowhere."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    return channel


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the chat's: it stops this process itself
    channel = _channel()

    def answer(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message, ensure_ascii=False) + "\n")
        channel.flush()

    try:
        functions = load_functions(json.loads(sys.argv[1]))
        specs = [describe(function, name) for name, function in functions.items()]
    except ToolDefinitionError as exc:
        answer({"refused": str(exc)})
        return
    answer({"tools": specs})
    for line in sys.stdin:
        request = json.loads(line)
        answer(call(functions[request["name"]], request["arguments"]))


if __name__ == "__main__":
    main()
