"""The REPL: the loop (``loop``), its ``/`` commands (``commands``), line editing (``line_editor``)."""

from localchat.cli.repl.commands import COMMANDS
from localchat.cli.repl.loop import Repl, read_input

REPL_COMMANDS = tuple(COMMANDS)

__all__ = ["REPL_COMMANDS", "Repl", "read_input"]
