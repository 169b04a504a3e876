"""What a terminal is shown: untrusted text through ``safe_text.visible``, our own styles intact.

``TerminalConsole`` applies the sanitiser to everything Rich prints: strings before Rich parses
(or silently strips) them, then every text segment, whoever built it. Our colours and cursor moves
are styles and control segments, so they stay, while the text inside them cannot act. Pipes keep
the exact text: ``for_stream`` sanitises only for a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TextIO

from rich.console import Console
from rich.segment import Segment

from localchat.safe_text import CONTROL, visible


def for_stream(stream: Any) -> Callable[[str], str]:
    """How text must be written to ``stream``: made visible on a terminal, exact elsewhere."""
    isatty = getattr(stream, "isatty", None)
    return visible if isatty is not None and isatty() else _exact


def _exact(text: str) -> str:
    return text


def wrap_parts(parts: Iterable[str], width: int, indent: str = "  ", sep: str = " · ") -> str:
    """``parts`` joined by ``sep`` in lines of at most ``width`` columns, broken only between
    parts (a figure and its label stay together; a part wider than the line stays whole)."""
    lines: list[str] = []
    for part in parts:
        candidate = f"{lines[-1]}{sep}{part}" if lines else indent + part
        if lines and len(candidate) <= width:
            lines[-1] = candidate
        else:
            lines.append(indent + part)
    return "\n".join(lines)


class TerminalConsole(Console):
    """A Rich console that never lets printed text act on the terminal."""

    def render_str(self, text: str, *args: Any, **kwargs: Any):
        return super().render_str(visible(text), *args, **kwargs)

    def render(self, renderable: Any, options: Any = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(visible(segment.text), segment.style, segment.control)


def console(file: TextIO | None = None, *, stderr: bool = False, soft_wrap: bool | None = False,
            force_terminal: bool | None = None, width: int | None = None) -> TerminalConsole:
    """The console every command prints through (no highlighting of numbers or paths). With
    ``soft_wrap=None``, long lines wrap at words on a terminal (never inside a word, and a wrapped
    line keeps its indentation) and stay whole through a pipe, so that what a script reads, an id
    or a command, is never cut."""
    made = TerminalConsole(file=file, stderr=stderr, highlight=False, soft_wrap=bool(soft_wrap),
                           force_terminal=force_terminal, width=width)
    if soft_wrap is None:
        made.soft_wrap = not made.is_terminal
    return made
