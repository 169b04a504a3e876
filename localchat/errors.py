"""The one package exception; the CLI layer alone turns it into a red line and an exit code."""

from __future__ import annotations

import threading


class LocalchatError(Exception):
    """A failure the user can act on; its message is one line, shown without a traceback."""

    exit_code = 1


class UsageError(LocalchatError):
    """Bad input from the command line or the prompt (exit code 2, like Typer's own)."""

    exit_code = 2


class OutputError(LocalchatError):
    """Standard output cannot take what is printed (full, closed, or an encoding without the
    characters): the command ends with one line, whatever it was doing."""


class TerminationRequested(KeyboardInterrupt):
    """SIGTERM, turned into the same clean path as Ctrl+C (see ``raise_on_sigterm``); exit 143."""


def raise_on_sigterm() -> threading.Event:
    """SIGTERM raises ``TerminationRequested`` where the main thread is. The event it returns stays
    set: a Python handler's exception is lost when it lands inside a finalizer (``__del__``) or an
    at-fork callback (logging's, after a child is started), where Python only reports it as
    unraisable, so a loop that waits on a server looks at it too (``raise_if_set``), and that report
    is not printed (it would be a traceback for a SIGTERM that is handled)."""
    import signal
    import sys

    came = threading.Event()

    def handler(signum, frame):
        came.set()
        raise TerminationRequested()

    def unraisable(report) -> None:
        if not isinstance(report.exc_value, TerminationRequested):
            sys.__unraisablehook__(report)

    signal.signal(signal.SIGTERM, handler)
    sys.unraisablehook = unraisable
    return came


def raise_if_set(came: threading.Event) -> None:
    """The termination a lost exception did not carry out (see ``raise_on_sigterm``)."""
    if came.is_set():
        raise TerminationRequested()
