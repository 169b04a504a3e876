"""The command line: the Typer app and one module per command group.

Commands collect options and call the package; errors and outcomes become exit codes here only.
"""

import os
import sys


def main() -> None:
    """The ``localchat`` command. Ctrl+C (or SIGTERM) while the app itself is still being imported
    or built is one line and 130 (143) too (inside a command, ``dispatch.user_errors`` maps it). Standard output is
    guarded (``stdout``): what it cannot take is one line, and what is left in its buffer is
    flushed here, where a failure can still be said."""
    from localchat.errors import TerminationRequested, raise_on_sigterm

    raise_on_sigterm()  # from the first moment: SIGTERM while still importing is one line and 143 too
    try:
        from localchat.cli.stdout import GuardedOutput

        sys.stdout = GuardedOutput(sys.stdout)
        from localchat.cli.app import app

        app()
    except TerminationRequested:
        sys.stderr.write("terminated (SIGTERM)\n")
        _exit_now(143)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        _exit_now(130)
    except RuntimeError as exc:  # Ctrl+C inside a class's __set_name__ while importing arrives wrapped
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        terminated = isinstance(exc.__cause__, TerminationRequested)
        sys.stderr.write("terminated (SIGTERM)\n" if terminated else "interrupted\n")
        _exit_now(143 if terminated else 130)
    except BrokenPipeError:  # `localchat chat … | head`: the reader left; nothing more to say
        _exit_now(141)
    except SystemExit as done:
        if done.code in (130, 143):  # interrupted or terminated: everything was cleaned up on the way
            _exit_now(done.code)
        _flush_stdout()
        raise


def _flush_stdout() -> None:
    """What is left in the guarded buffer goes out now, or its failure is one line."""
    from localchat.errors import OutputError

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _exit_now(141)
    except OutputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        _exit_now(1)


def _exit_now(code: int) -> None:
    """Exit with ``code`` at once. After a caught Ctrl+C, CPython may still end the process by
    SIGINT (exit -2) if a KeyboardInterrupt went through one of its internal code runners."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
