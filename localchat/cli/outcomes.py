"""Every exit code localchat returns, in one table: turns, reports, usage errors, signals."""

from __future__ import annotations

from localchat.conversation.turn import TurnStatus

OK = 0
FAILED = 1
USAGE = 2  # like Typer's own
INTERRUPTED = 130  # 128 + SIGINT
TERMINATED = 143  # 128 + SIGTERM

TURN_EXIT_CODES = {
    TurnStatus.COMMITTED: OK,
    TurnStatus.NOT_KEPT: OK,
    TurnStatus.CUT: OK,  # the reply was shown; the notice says it was not kept
    TurnStatus.EMPTY: OK,
    TurnStatus.INVALID: FAILED,
    TurnStatus.UNRENDERABLE: FAILED,  # shown, but the model's template would refuse it in history
    TurnStatus.ERROR: FAILED,
    TurnStatus.INTERRUPTED: INTERRUPTED,
}


def turn_exit(status: TurnStatus) -> int:
    return TURN_EXIT_CODES[status]


def report_exit(ok: bool) -> int:
    """smoke, parity, bench: all required checks passed, or not."""
    return OK if ok else FAILED
