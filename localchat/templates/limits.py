"""A time limit around rendering a chat template: templates are code from the model's repository,
and one with nested loops can render for minutes (and fill memory) before it returns.

In the main thread a ``SIGALRM`` timer interrupts the render at no cost per line; in other threads
(load's simulated users) the render is traced, line by line of the template's own code only.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

RENDER_LIMIT_S = 5.0  # a 300-turn conversation renders in ~20 ms here: this is only ever a runaway
TEMPLATE_CODE = "<template>"  # the file name jinja gives the code it compiles templates to


class RenderTimeout(Exception):
    def __init__(self, seconds: float):
        super().__init__(f"it rendered for over {seconds:g}s (a runaway template?)")


@contextmanager
def time_limit(seconds: float | None = None) -> Iterator[None]:
    seconds = RENDER_LIMIT_S if seconds is None else seconds
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        with _alarm(seconds):
            yield
    else:
        with _traced(seconds):
            yield


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def expired(signum, frame):
        raise RenderTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _traced(seconds: float) -> Iterator[None]:
    deadline = time.monotonic() + seconds

    def line(frame, event, arg):
        if time.monotonic() > deadline:
            raise RenderTimeout(seconds)
        return line

    def call(frame, event, arg):
        return line if frame.f_code.co_filename == TEMPLATE_CODE else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(previous)
