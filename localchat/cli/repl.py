"""The interactive loop: read a line, run a local command or one turn, show the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from localchat.cli.render import ChatUI, count
from localchat.conversation.compaction import DEFAULT_KEEP, compact
from localchat.conversation.turn import ChatSession
from localchat.errors import LocalchatError, TerminationRequested, UsageError
from localchat.store.saved_sessions import SessionSaver, StoreError

MULTILINE = '"""'
REPL_COMMANDS = ("/history", "/preview", "/reset", "/stats", "/think", "/save", "/help", "/quit", "/exit",
                 "/compact", "/uncompact", "/pin", "/pins", "/unpin")


def read_input(read_line: Callable[[str], str]) -> str:
    """One user input; a line of only \"\"\" opens a block that the next such line closes."""
    line = read_line(">>> ")
    if line.strip() != MULTILINE:
        return line
    lines = []
    while (line := read_line("... ")).strip() != MULTILINE:
        lines.append(line)
    return "\n".join(lines)


def _enable_line_editing() -> None:
    try:
        import readline  # noqa: F401  (arrow keys and input history for input())
    except ImportError:
        pass


class Repl:
    def __init__(self, session: ChatSession, ui: ChatUI, read_line: Callable[[str], str] = input,
                 saver: SessionSaver | None = None):
        self.session = session
        self.ui = ui
        self.read_line = read_line
        self.saver = saver
        self.commands: dict[str, Callable[[str], bool]] = dict(zip(REPL_COMMANDS, (
            self._history, self._preview, self._reset, self._stats, self._think, self._save, self._help,
            self._quit, self._quit, self._compact, self._uncompact, self._pin, self._pins, self._unpin)))

    def run(self) -> None:
        if self.read_line is input:
            _enable_line_editing()
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
                self.ui.help()
                return True
            return command(arg.strip())
        try:
            result = self.session.ask(text, self.ui.listeners(), self.ui.compaction)
        except UsageError as exc:
            self.ui.error(str(exc))
            return True
        self.ui.end_turn(result, self.session.params.max_tokens)
        return True

    def _history(self, _: str) -> bool:
        conversation = self.session.conversation
        messages = conversation.messages()
        self.ui.messages(messages, f"history: {count(len(messages), 'message')}")
        if conversation.fold_system and conversation.system:
            self.ui.info("this model's template takes no system message: it is sent at the head of the first "
                         "user message")
        return True

    def _preview(self, arg: str) -> bool:
        if not arg:
            self.ui.error("usage: /preview TEXT")
            return True
        try:
            messages = self.session.preview(arg)
            tokens = self.session.backend.count_tokens(messages, self.session.params.think)
        except LocalchatError as exc:  # over the budget, or the template refuses the messages
            self.ui.error(str(exc))
            return True
        counted = f", {count(tokens, 'token')}" if tokens is not None else ""
        self.ui.messages(messages, f"preview: {count(len(messages), 'message')}{counted} (history unchanged)")
        return True

    def _reset(self, _: str) -> bool:
        self.session.conversation.reset()
        kept = " and pins" if self.session.conversation.pins else ""
        self.ui.info(f"history and notes cleared (system message{kept} kept)")
        return True

    def _compact(self, focus: str) -> bool:
        policy = self.session.compaction
        done = compact(self.session, focus, keep=policy.keep if policy else DEFAULT_KEEP,
                       backend=policy.backend if policy else None)
        self.ui.compaction(done)
        return True

    def _uncompact(self, _: str) -> bool:
        back = self.session.conversation.uncompact()
        self.ui.info(f"restored {count(back, 'turn')}; the notes are gone" if back else
                     "nothing to restore: no compaction in this session (a resumed summary has no turns behind it)")
        return True

    def _pin(self, text: str) -> bool:
        if not text.strip():
            self.ui.error("usage: /pin TEXT (e.g. /pin the order number is INV-2026-004417)")
            return True
        try:
            self.session.pin(text)
        except LocalchatError as exc:
            self.ui.error(str(exc))
            return True
        self.ui.info(f"pinned ({count(len(self.session.conversation.pins), 'pin')}): trimming and compaction keep it")
        return True

    def _pins(self, _: str) -> bool:
        pins = self.session.conversation.pins
        self.ui.messages([{"role": "pin", "content": p} for p in pins], f"pins: {count(len(pins), 'pin')}")
        return True

    def _unpin(self, arg: str) -> bool:
        pins, arg = self.session.conversation.pins, arg.strip()
        if not (arg.isascii() and arg.isdigit()) or not 1 <= int(arg) <= len(pins):
            self.ui.error(f"usage: /unpin N, N from 1 to {len(pins)} (see /pins)" if pins else "nothing is pinned")
            return True
        self.ui.info(f"unpinned: {pins.pop(int(arg) - 1)}")
        return True

    def _stats(self, _: str) -> bool:
        ledger = self.session.ledger
        self.ui.ledger(ledger.summary(), ledger.turns[-1] if ledger.turns else None)
        return True

    def _think(self, arg: str) -> bool:
        """``/think on|off``: the next turns reason first or answer directly (``/think`` alone says which)."""
        choices = {"on": True, "off": False}
        if arg not in choices:
            current = {True: "on", False: "off", None: "the model's default"}[self.session.params.think]
            self.ui.info(f"thinking: {current} (usage: /think on|off)")
            return True
        self.session.params = replace(self.session.params, think=choices[arg])
        self.ui.info(f"thinking {arg} from the next turn")
        template = self.session.backend.template
        said = template.traits.notices(self.session.backend.model_id, system=False, think=choices[arg]) if template else []
        for notice in said:
            self.ui.notice(notice.replace("--no-think", "/think off").replace("--think", "/think on"))
        return True

    def _save(self, arg: str) -> bool:
        if self.saver is None:
            self.ui.error("saving is not available here")
            return True
        try:
            name, replaced = self.saver.save(self.session, arg or None)
        except (UsageError, StoreError) as exc:
            self.ui.error(str(exc))
            return True
        turns = len(self.session.conversation.turns)
        self.ui.info(f"{'updated' if replaced else 'saved'} '{name}' ({turns} turn(s)); "
                     f"continue later with: localchat chat --resume {name}")
        return True

    def _help(self, _: str) -> bool:
        self.ui.help()
        return True

    def _quit(self, _: str) -> bool:
        return False
