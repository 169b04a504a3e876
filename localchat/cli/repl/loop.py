"""The interactive loop: read an input, run a ``/`` command or one turn, show the result."""

from __future__ import annotations

from collections.abc import Callable

from localchat.cli.render import ChatUI
from localchat.conversation.attachment import Attachment
from localchat.conversation.result import TurnResult
from localchat.conversation.turn import ChatSession
from localchat.errors import TerminationRequested, UsageError
from localchat.store.saved_sessions import SessionSaver

MULTILINE = '"""'


def read_input(read_line: Callable[[str], str]) -> str:
    """One user input; a line of only \"\"\" opens a block that the next such line closes."""
    line = read_line(">>> ")
    if line.strip() != MULTILINE:
        return line
    lines = []
    while (line := read_line("... ")).strip() != MULTILINE:
        lines.append(line)
    return "\n".join(lines)


class Repl:
    """The session's REPL: what was last answered and what waits for the next message live here;
    the commands (``repl.commands``) act through the session and its history builder."""

    def __init__(self, session: ChatSession, ui: ChatUI, read_line: Callable[[str], str] = input,
                 saver: SessionSaver | None = None):
        from localchat.cli.repl.commands import COMMANDS

        self.session = session
        self.ui = ui
        self.read_line = read_line
        self.saver = saver
        self.commands = COMMANDS
        self.last_answer: str | None = None  # for /copy: the last reply shown, kept or not
        self.attachment: Attachment | None = None  # /load FILE: goes into the next message

    def run(self) -> None:
        self.ui.info("Type a message, /help for commands, /quit to leave.")
        while True:
            try:
                text = read_input(self.read_line)
            except TerminationRequested:
                raise
            except (EOFError, KeyboardInterrupt):
                self.ui.info("bye")
                return
            if not self.handle(text):
                return

    def handle(self, text: str) -> bool:
        """Act on one input; False means leave the loop."""
        if not text.strip():
            return True
        if text.startswith("/"):
            name, _, arg = text.strip().partition(" ")
            command = self.commands.get(name)
            if command is None:
                self.ui.error(f"unknown command {name}")
                return self.commands["/help"].run(self, "")
            return command.run(self, arg.strip())
        message = self.attachment.into(text) if self.attachment else text
        if self.turn(lambda: self.session.ask(message, self.ui.listeners(), self.ui.compaction)):
            self.attachment = None  # the message that was sent took it
        return True

    def turn(self, ask: Callable[[], TurnResult]) -> bool:
        """One model turn (a question, or ``/retry``), shown as it streams, then its outcome;
        False when it was refused before anything was sent."""
        try:
            result = ask()
        except UsageError as exc:
            self.ui.error(str(exc))
            return False
        self.ui.end_turn(result, self.session.params.max_tokens)
        if result.text.strip():
            self.last_answer = result.text
        return True
