"""The interactive loop: read an input, run a ``/`` command or one turn, show the result.

Ctrl+C at the prompt clears the line (on a terminal) and says how to leave; Ctrl+D or ``/quit``
leaves. Leaving with turns that were never saved says so first (on a terminal, a second ``/quit``
leaves anyway); a resumed session is saved again instead.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from localchat.cli.figures import kept_line, saved_line
from localchat.cli.render import ChatUI
from localchat.cli.repl.line_editor import KeysDropped
from localchat.conversation.attachment import Attachment
from localchat.conversation.result import TurnResult
from localchat.conversation.turn import ChatSession
from localchat.errors import TerminationRequested, UsageError
from localchat.store.keeper import SessionSaver
from localchat.wording import count, run_as

MULTILINE = '"""'
HOW_TO_LEAVE = "Ctrl+C clears the line; /quit or Ctrl+D leaves"


def read_input(read_line: Callable[[str], str]) -> str:
    """One user input; a line of only \"\"\" opens a block that the next such line closes."""
    line = read_line(">>> ")
    if line.strip() != MULTILINE:
        return line
    lines = []
    while (line := read_line("... ")).strip() != MULTILINE:
        lines.append(line)
    return "\n".join(lines)


class ReplLoop:
    """The session's REPL: what was last answered and what waits for the next message live here;
    the commands it is given (``commands``: name → ``Command``) act through the session and its
    history builder.

    ``interactive``: a person at a terminal (Ctrl+C clears the line, leaving unsaved asks twice);
    ``autosave``: leaving saves the conversation again (a resumed one); ``while_replying``: what
    the terminal does with keys typed while a reply streams (see ``line_editor.typed_ahead``)."""

    def __init__(
        self,
        session: ChatSession,
        ui: ChatUI,
        read_line: Callable[[str], str] = input,
        saver: SessionSaver | None = None,
        *,
        commands: dict[str, Any],
        interactive: bool = False,
        autosave: bool = False,
        while_replying: Callable[[], AbstractContextManager[KeysDropped]] = lambda: nullcontext(KeysDropped()),
    ):
        self.session = session
        self.ui = ui
        self.read_line = read_line
        self.saver = saver
        self.commands = commands
        self.interactive = interactive
        self.autosave = autosave
        self.while_replying = while_replying
        ui.in_repl = True  # its hints name REPL commands (/set max_tokens N), not the command's flags
        self.last_answer: str | None = None  # for /copy: the last reply shown, kept or not
        self.taken_back = 0  # turns the current input took back from the kept conversation
        self.attachment: Attachment | None = None  # /load FILE: goes into the next message
        self._warned_unsaved = False

    def run(self) -> None:
        self.ui.info(f"Type a message, /help for commands ({HOW_TO_LEAVE}).")
        while True:
            try:
                text = read_input(self.read_line)
            except TerminationRequested:
                raise
            except KeyboardInterrupt:
                if not self.interactive:
                    raise  # a script's Ctrl+C ends the command (130)
                self.ui.info(f"({HOW_TO_LEAVE})")
                continue
            except EOFError:
                self.keep()
                if self.may_leave():
                    return
                continue
            going_on = self.handle(text)
            self.keep()
            if not going_on and self.may_leave():
                return

    def keep(self) -> None:
        """What the last input changed, kept now (every accepted turn, as it commits); turns the
        input took back (``/undo``, a ``/retry`` whose answer replaced the old one) marked so."""
        taken_back, self.taken_back = self.taken_back, 0
        if self.saver is not None and (note := self.saver.kept(self.session, taken_back)):
            self.ui.notice(note)

    def may_leave(self) -> bool:
        """Whether the REPL may end now. A kept conversation leaves at once (its KV cache written
        for ``--continue``); else turns never saved are said first: on a terminal the next
        ``/quit`` or Ctrl+D leaves; elsewhere it leaves at once, with the notice."""
        conversation = self.session.conversation
        if self.saver is not None and self.saver.stale:
            again = f"{run_as()} chat --resume {self.saver.name or self.saver.uid}"
            self.ui.notice(f"left; the turns asked here since it was continued elsewhere were not kept ({again} "
                           "goes on from its latest turn)")
            return True
        if self.saver is not None and self.saver.logging and not self.saver.unsaved(self.session):
            cache = self.saver.leave(self.session)
            self.ui.info(kept_line(self.saver.name, self.saver.uid, len(conversation.turns), cache)
                         if conversation.turns else "bye")
            return True
        lose = bool(conversation.turns or conversation.pins or conversation.summary)
        if self.saver is None or not lose or not self.saver.unsaved(self.session):
            self.ui.info("bye")
            return True
        turns = len(conversation.turns)
        if self.autosave:
            self.ui.info(saved_line(self.saver.save(self.session), turns))
            return True
        if self.interactive and not self._warned_unsaved:
            self._warned_unsaved = True
            self.ui.notice(f"{count(turns, 'turn')} not saved: /save NAME keeps them ({run_as()} chat --resume NAME "
                           "continues); /quit or Ctrl+D again leaves without saving")
            return False
        self.ui.notice(f"left without saving {count(turns, 'turn')} (/save NAME before /quit keeps them)")
        return True

    def handle(self, text: str) -> bool:
        """Act on one input; False means the user asked to leave."""
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

    def turn(self, ask: Callable[[], TurnResult]) -> TurnResult | None:
        """One model turn (a question, or ``/retry``), shown as it streams, then its outcome; None
        when it was refused before anything was sent."""
        try:
            with self.while_replying() as dropped:
                result = ask()
        except UsageError as exc:
            self.ui.error(str(exc))
            return None
        finally:
            self.ui.stop_waiting()
        self.ui.end_turn(result, self.session.params.max_tokens)
        if dropped.count:
            self.ui.notice(f"dropped what was typed while the reply streamed ({count(dropped.count, 'byte')}): "
                           "type it at the prompt")
        if result.text.strip():
            self.last_answer = result.text
        return result
