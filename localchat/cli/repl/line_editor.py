"""Line editing on a terminal, as in a shell (prompt_toolkit): history kept across sessions,
Ctrl+R to search it, a pasted block arriving as one message (bracketed paste), Tab to complete
``/`` commands and ``/load`` paths. Without a terminal the REPL reads lines as ``input()`` would,
but never more than the input limit of one (``piped_reader``).

The history file lives in the user's data directory, readable by the user only; a line that holds
a secret (the API key) is never written to it.
"""

from __future__ import annotations

import datetime
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from localchat.conversation.attachment import BYTES_PER_CHAR
from localchat.errors import UsageError
from localchat.files import private_dirs

HISTORY_FILE = "input_history"
MAX_PIPED_LINE = 16 * 1024**2


@dataclass
class KeysDropped:
    """How many keys were typed while a reply streamed, and dropped (known once it has ended)."""

    count: int = 0


@contextmanager
def typed_ahead(stdin: TextIO) -> Iterator[KeysDropped]:
    """While a reply streams, keys typed on the terminal are neither echoed above the answer nor
    run at the next prompt: echo is off (Ctrl+C still interrupts) and what was typed is dropped at
    the end, counted so the REPL can say so. Line editing is off too: in it, keys typed without
    Enter wait where no count can see them, and would vanish unsaid."""
    import termios

    dropped = KeysDropped()
    fd = stdin.fileno()
    try:
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError):  # not a terminal after all
        yield dropped
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield dropped
    finally:
        dropped.count = _pending_bytes(fd)
        termios.tcflush(fd, termios.TCIFLUSH)
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _pending_bytes(fd: int) -> int:
    import fcntl
    import struct
    import termios

    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def private_history(path: Path, secrets: Iterable[str], on_notice: Callable[[str], None] = lambda _: None):
    """prompt_toolkit's FileHistory in a private (0600) regular file, never through a link, skipping
    lines that hold a secret; an OSError (its reason in words) when the file cannot be that."""
    from prompt_toolkit.history import FileHistory

    hidden = [s for s in secrets if s]

    class PrivateHistory(FileHistory):
        def store_string(self, string: str) -> None:
            if any(secret in string for secret in hidden):
                return
            entry = f"\n# {datetime.datetime.now()}\n" + "".join(f"+{line}\n" for line in string.split("\n"))
            try:
                with os.fdopen(
                    _open_private(Path(os.fsdecode(self.filename))), "ab"
                ) as f:  # prompt_toolkit's own format
                    f.write(entry.encode("utf-8"))
            except OSError:  # replaced or full since the start: the line stays in memory only
                pass

    private_dirs(path.parent)
    fd = _open_private(path)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode != 0o600:
            os.fchmod(fd, 0o600)
            on_notice(f"input history {path} was mode {mode:04o}: made private (0600)")
    finally:
        os.close(fd)
    return PrivateHistory(str(path))


def _open_private(path: Path) -> int:
    """The history file opened for appending: created 0600, a regular file only (a link, a
    directory or a FIFO is an OSError saying so, and nothing waits)."""
    flags = os.O_CREAT | os.O_APPEND | os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(exc.errno, "it is a symbolic link (not followed)") from None
        if exc.errno == errno.ENXIO:
            raise OSError(exc.errno, "it is a FIFO, not a file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file")
    return fd


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
            history = private_history(history_path, secrets, on_notice)
        except OSError as exc:
            on_notice(f"input history not kept ({history_path}: {exc.strerror}); this session's is in memory")
    session: PromptSession[str] = PromptSession(
        history=history, completer=command_completer(commands), complete_while_typing=False
    )
    return lambda prompt: session.prompt(prompt)


def piped_reader(source: BinaryIO, echo: TextIO, max_chars: int) -> Callable[[str], str]:
    """``read_line(prompt)`` for a pipe or a file, as ``input()`` reads one, but never an endless
    line: a line longer than the input limit is refused by the input check like any other, and one
    past ``MAX_PIPED_LINE`` bytes (a stream that never breaks its line, ``< /dev/zero``) ends the
    REPL with a usage error instead of filling memory. Bytes that are not UTF-8 are kept as
    ``input()`` keeps them, for the input check to refuse."""
    limit = max(MAX_PIPED_LINE, max_chars * BYTES_PER_CHAR + 2)  # (+ "\r\n")

    def read_line(prompt: str) -> str:
        echo.write(prompt)
        echo.flush()
        line = source.readline(limit + 1)
        if not line:
            raise EOFError
        if len(line) > limit:
            raise UsageError(f"a line of standard input goes on past {limit:,} bytes; stopped reading")
        return line.decode("utf-8", errors="surrogateescape").removesuffix("\n")

    return read_line
