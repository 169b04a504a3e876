"""Answers rendered as Markdown while they stream, on a terminal only (Rich's ``Markdown``).

Finished blocks (text up to a blank line outside a code fence, once the next block has begun)
are printed once and stay; only the block in progress is redrawn, in a ``Live`` region showing
its last screenful. Redraws are spaced so that rendering takes at most ~1 % of the wall time
(at least ``MIN_REFRESH_S`` apart): decoding runs in the same thread and must not slow down.
Pipes, ``--json``, records and history get the raw text; this only changes what a terminal shows.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.segment import Segment

from localchat.safe_text import visible

MIN_REFRESH_S = 0.1
RENDER_SHARE = 0.01  # redraw only when the last redraw took at most this share of the time since
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def finished_end(text: str, start: int) -> int:
    """Where the finished blocks of ``text[start:]`` end: after the last blank line outside a
    code fence that some later text follows; ``start`` when there is none."""
    end, fenced, position, blank_at = start, False, start, None
    for line in text[start:].splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and not line.strip():
            blank_at = position + len(line)
        elif blank_at is not None and not fenced:
            end, blank_at = blank_at, None
        position += len(line)
    return end


class ChatMarkdown(Markdown):
    """Rich's Markdown as a chat answer needs it: the model's single line breaks kept (a poem or an
    address stays on its lines; CommonMark would join them into one paragraph), and links shown
    with their address rather than made clickable (a model's text cannot hide where a link goes)."""

    def __init__(self, markup: str):
        super().__init__(markup, hyperlinks=False)
        for token in self.parsed:
            for child in token.children or ():
                if child.type == "softbreak":
                    child.type = "hardbreak"


class _Lines:
    """Already rendered lines, as a renderable (the last screenful of the block in progress), without
    the padding Markdown gives them, and two columns short of the edge: the terminal echoes a Ctrl+C
    (``^C``, two characters) where the cursor rests, and had it wrapped to a new line, the erase that
    ends the live region would miss its top line (left on the screen, above the reply's final text)."""

    def __init__(self, lines: list[list[Segment]]):
        self.lines = [unpadded(line) for line in lines]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.lines:
            yield from line
            yield Segment.line()


def unpadded(line: list[Segment]) -> list[Segment]:
    """``line`` without its trailing blanks."""
    kept = list(line)
    while kept and not kept[-1].control and not kept[-1].text.rstrip():
        kept.pop()
    if kept and not kept[-1].control:
        last = kept[-1]
        kept[-1] = Segment(last.text.rstrip(), last.style)
    return kept


@contextmanager
def whole() -> Iterator[None]:
    """A redraw that Ctrl+C does not cut in two: the interrupt waits for the screen to be whole, then
    comes as it would have (cut in the middle, the blocks being printed were printed again when the
    reply was closed). Only the main thread receives signals; where SIGINT is ignored it stays so."""
    current = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or current in (signal.SIG_IGN, None):
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, current)
        if came:
            signal.raise_signal(signal.SIGINT)


class MarkdownStream:
    def __init__(self, console: Console):
        self.console = console
        self.text = ""
        self.printed = 0  # text[:printed] is on the screen for good
        self.live: Live | None = None
        self.next_redraw = 0.0

    def feed(self, chunk: str) -> None:
        self.text += visible(chunk)  # a terminal only: nothing a model sends may act on it
        now = time.perf_counter()
        if now < self.next_redraw:
            return
        with whole():
            self._print_finished()
            self._redraw()
        spent = time.perf_counter() - now
        self.next_redraw = now + max(MIN_REFRESH_S, spent / RENDER_SHARE)

    def close(self) -> None:
        """Print what is left for good and end the live region."""
        with whole():
            if self.live is not None:
                self.live.stop()
                self.live = None
            rest = self.text[self.printed:]
            if rest.strip():
                self.console.print(ChatMarkdown(rest))
            self.text, self.printed, self.next_redraw = "", 0, 0.0

    def _print_finished(self) -> None:
        end = finished_end(self.text, self.printed)
        if end > self.printed:
            self.console.print(ChatMarkdown(self.text[self.printed:end]))  # above the live region
            self.printed = end

    def _redraw(self) -> None:
        tail = self.text[self.printed:]
        narrower = self.console.options.update_width(max(1, self.console.width - 2))  # (room for a ``^C``)
        lines = self.console.render_lines(ChatMarkdown(tail), narrower, pad=False) if tail.strip() else []
        visible = lines[-max(1, self.console.size.height - 1):]
        if self.live is None:
            self.live = Live(console=self.console, auto_refresh=False, transient=True, redirect_stdout=False,
                             redirect_stderr=False)
            self.live.start()
        self.live.update(_Lines(visible), refresh=True)
