"""Every exit code localchat returns, in one table: turns, reports, usage errors, signals."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localchat.conversation.result import TurnStatus

OK = 0
FAILED = 1
USAGE = 2  # like Typer's own
INTERRUPTED = 130  # 128 + SIGINT
TERMINATED = 143  # 128 + SIGTERM

TURN_EXIT_CODES = {  # by TurnStatus value: this table is read before any turn module is loaded
    "committed": OK,
    "not-kept": OK,
    "cut": OK,  # the reply was shown; the notice says it was not kept
    "empty": OK,
    "invalid-json": FAILED,
    "unrenderable": FAILED,  # shown, but the model's template would refuse it in history
    "error": FAILED,
    "interrupted": INTERRUPTED,
}


def turn_exit(status: TurnStatus, formatted: bool = False) -> int:
    """A turn's exit code; with an answer format asked for (``--json``, ``--regex``…), a reply cut
    short or empty gave no valid answer (stdout got nothing): a failure."""
    if formatted and status.value in ("cut", "empty"):
        return FAILED
    return TURN_EXIT_CODES[status.value]


def report_exit(ok: bool) -> int:
    """smoke, parity, bench: all required checks passed, or not."""
    return OK if ok else FAILED
