"""What the terminal shows of a server it started: its start's progress (heeding SIGTERM), the
tail of its log when it failed, and why a server on several ranks ended."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from localchat.errors import Termination, raise_if_set
from localchat.server.distributed import Ranks, exit_words, failed_rank
from localchat.server.launch import RunningServer, ServerStartError, last_lines


def heeding(terminated: Termination, show: Callable[[str], None]) -> Callable[[str], None]:
    """``show``, after raising a termination whose exception was lost (see ``raise_on_sigterm``)."""

    def on_poll(text: str) -> None:
        raise_if_set(terminated)
        show(text)

    return on_poll


def ended_line(server: RunningServer, ranks: Ranks) -> str:
    """Why a server that was not stopped by us has ended: the rank and its signal, and the log's
    last error (or that it shows none)."""
    log = server.log_path
    rank = failed_rank(last_lines(log, 200, server.log_from))
    why = server.failure() if rank else f"the launcher {exit_words(server.process.returncode)}; " + server.failure()
    return f"mlx_lm.server on {ranks.size} ranks ended: {why}; every rank has stopped (log: {log})"


def show_log_tail(console: Console, path: Path, lines: int = 12) -> None:
    """The end of the server's log, dim, above the one error line."""
    tail = last_lines(path, lines).rstrip()
    if tail:
        console.print(f"the end of {path}:", style="dim", markup=False)
        console.print(tail, style="dim", markup=False, highlight=False)


@contextmanager
def shown_log_on_failure(console: Console):
    """A server that failed to start shows its log's tail before its error line."""
    try:
        yield
    except ServerStartError as exc:
        if exc.log_path is not None:
            show_log_tail(console, exc.log_path)
        raise
