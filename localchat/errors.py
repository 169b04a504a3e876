"""The one package exception; the CLI layer alone turns it into a red line and an exit code."""


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


def raise_on_sigterm() -> None:
    import signal

    def handler(signum, frame):
        raise TerminationRequested()

    signal.signal(signal.SIGTERM, handler)
