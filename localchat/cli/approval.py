"""Asking before a tool runs, on a terminal: yes, no, or always for this tool (this session)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from localchat.cli.render import ChatUI, shortened
from localchat.tools.runner import REFUSED_BY_USER

ANSWERS = {"y": "yes", "yes": "yes", "n": "no", "no": "no", "": "no", "a": "always", "always": "always"}


class AskBeforeRunning:
    """The approval a terminal gives: each call shown whole, then ``run it? [y]es/[n]o/[a]lways``.
    Ctrl+C while asking ends the turn (history unchanged); end of input refuses."""

    def __init__(self, ui: ChatUI, read_line: Callable[[str], str]):
        self.ui, self.read_line = ui, read_line
        self.always: set[str] = set()

    def __call__(self, name: str, arguments: dict[str, Any]) -> str | None:
        if name in self.always:
            return None
        shown = shortened(json.dumps(arguments, ensure_ascii=False), 2000)
        self.ui.info(f"the model asks to run {name} with {shown}")
        while True:
            try:
                answer = ANSWERS.get(self.read_line(f"run {name}? [y]es / [n]o / [a]lways for {name}: ").strip().lower())
            except EOFError:
                return REFUSED_BY_USER
            if answer == "always":
                self.always.add(name)
            if answer in ("yes", "always"):
                return None
            if answer == "no":
                return REFUSED_BY_USER
            self.ui.notice("answer y, n or a")


def terminal_asker() -> Callable[[str], str]:
    """A line read on the terminal (prompt_toolkit, which draws it even while the reply's keys are
    held back), with no history of its own."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.output import create_output

    session = PromptSession(output=create_output(stdout=sys.stderr))  # stdout may be a pipe for the answer
    return lambda prompt: session.prompt(prompt)
