"""The REPL: the loop (``loop``), its ``/`` commands (``commands``), line editing (``line_editor``)."""

from typing import Any

from localchat.cli.repl.commands import COMMANDS
from localchat.cli.repl.loop import ReplLoop, read_input

REPL_COMMANDS = tuple(COMMANDS)


class Repl(ReplLoop):
    """The loop with localchat's command table."""

    def __init__(self, session: Any, ui: Any, **kwargs: Any):
        super().__init__(session, ui, commands=COMMANDS, **kwargs)


__all__ = ["REPL_COMMANDS", "Repl", "read_input"]
