"""Line editing on a terminal, as in a shell (prompt_toolkit): history kept across sessions,
Ctrl+R to search it, a pasted block arriving as one message (bracketed paste), Tab to complete
``/`` commands and ``/load`` paths. Without a terminal the REPL reads with plain ``input()``.

The history file lives in the user's data directory, readable by the user only; a line that holds
a secret (the API key) is never written to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

HISTORY_FILE = "input_history"


def private_history(path: Path, secrets: Iterable[str]):
    """prompt_toolkit's FileHistory in a 0600 file, skipping lines that hold a secret."""
    from prompt_toolkit.history import FileHistory

    class PrivateHistory(FileHistory):
        def store_string(self, string: str) -> None:
            if not any(secret in string for secret in hidden):
                super().store_string(string)

    hidden = [s for s in secrets if s]
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600))
    os.chmod(path, 0o600)
    return PrivateHistory(str(path))


def command_completer(names: Iterable[str]):
    """``/`` commands by prefix; after ``/load `` the file system's paths."""
    from prompt_toolkit.completion import Completer, Completion, PathCompleter
    from prompt_toolkit.document import Document

    commands, paths = sorted(names), PathCompleter(expanduser=True)

    class Commands(Completer):
        def get_completions(self, document, complete_event) -> Iterator[Completion]:
            text = document.text_before_cursor
            if text.startswith("/load "):
                rest = text[len("/load "):]
                yield from paths.get_completions(Document(rest, len(rest)), complete_event)
            elif text.startswith("/") and " " not in text:
                yield from (Completion(name, start_position=-len(text)) for name in commands if name.startswith(text))

    return Commands()


def terminal_reader(history_path: Path | None, commands: Iterable[str], secrets: Iterable[str] = (),
                    on_notice: Callable[[str], None] = lambda _: None) -> Callable[[str], str]:
    """``read_line(prompt)`` for a terminal. A history file that cannot be used is said once and
    the session goes on with history in memory."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    history = InMemoryHistory()
    if history_path is not None:
        try:
            history = private_history(history_path, secrets)
        except OSError as exc:
            on_notice(f"input history not kept ({history_path}: {exc.strerror}); this session's is in memory")
    session = PromptSession(history=history, completer=command_completer(commands), complete_while_typing=False)
    return lambda prompt: session.prompt(prompt)
