"""The one package exception; the CLI layer alone turns it into a red line and an exit code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


@dataclass
class Termination:
    """Whether SIGTERM came, and whether its exception was lost where Python cannot raise one.
    Plain fields, no lock: a signal handler runs between any two steps of the main thread, inside
    a lock's own code too (an ``Event``'s lock, taken by a handler that interrupted it, never comes
    free)."""

    came: bool = False
    lost: bool = False

    def is_set(self) -> bool:
        return self.came


def raise_on_sigterm() -> Termination:
    """SIGTERM raises ``TerminationRequested`` where the main thread is; a SIGTERM that comes while
    that is being handled (the cleanup after it) raises nothing more, so the cleanup is not cut
    short. The exception is lost when it lands inside a finalizer (``__del__``) or an at-fork
    callback (logging's, after a child is started), where Python only reports it as unraisable:
    that report is not printed (a traceback for a SIGTERM that is handled), a loop that waits on a
    server looks at ``came`` (``raise_if_set``), and the next SIGTERM raises again. Called again
    (a command after the CLI's own start), it keeps a ``Termination`` whose SIGTERM was lost: one
    lost while the command was still importing is not forgotten."""
    import signal
    import sys

    installed = signal.getsignal(signal.SIGTERM)
    lost = installed.termination if isinstance(installed, RaisingHandler) and installed.termination.lost else None
    termination = lost or Termination()
    signal.signal(signal.SIGTERM, RaisingHandler(termination=termination))
    sys.unraisablehook = QuietTermination(termination=termination, previous=getattr(
        sys.unraisablehook, "previous", sys.unraisablehook))  # (set again: the hook before the first)
    return termination


@dataclass
class RaisingHandler:
    """SIGTERM's handler: ``TerminationRequested``, once."""

    termination: Termination

    def __call__(self, signum: int, frame: Any) -> None:
        if self.termination.came and not self.termination.lost:
            return  # (already stopping)
        self.termination.came, self.termination.lost = True, False
        raise TerminationRequested()


@dataclass
class QuietTermination:
    """Python's hook for an exception it cannot raise: a ``TerminationRequested`` is kept as lost, not
    printed; any other goes to the hook that was there before."""

    termination: Termination
    previous: Any

    def __call__(self, report: Any) -> None:
        if isinstance(report.exc_value, TerminationRequested):
            self.termination.lost = True
        else:
            self.previous(report)


def raise_if_set(termination: Termination) -> None:
    """The termination a lost exception did not carry out (see ``raise_on_sigterm``)."""
    if termination.came:
        raise TerminationRequested()
