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
    """The approval a terminal gives, under the call's line (``→ add({…})``): ``run add? [y]es/[n]o/
    [a]lways``, with the arguments in full first when that line had to cut them.
    Ctrl+C while asking ends the turn (history unchanged); end of input refuses."""

    def __init__(self, ui: ChatUI, read_line: Callable[[str], str]):
        self.ui, self.read_line = ui, read_line
        self.always: set[str] = set()

    def __call__(self, name: str, arguments: dict[str, Any]) -> str | None:
        if name in self.always:
            return None
        whole = json.dumps(arguments, ensure_ascii=False)
        if shortened(whole) != whole:  # the call's line above was cut: the arguments in full first
            self.ui.info(f"its arguments in full: {shortened(whole, 4000)}")
        while True:
            try:
                answer = ANSWERS.get(
                    self.read_line(f"run {name}? [y]es / [n]o / [a]lways for {name}: ").strip().lower()
                )
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

    session: PromptSession[str] = PromptSession(
        output=create_output(stdout=sys.stderr)
    )  # stdout may be a pipe for the answer
    return lambda prompt: session.prompt(prompt)
