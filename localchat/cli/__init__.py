"""The command line: the Typer app and one module per command group.

Commands collect options and call the package; errors and outcomes become exit codes here only.
"""

import sys


def main() -> None:
    """The ``localchat`` command. Ctrl+C while the app itself is still being imported is one
    line and 130 too (from then on ``app.user_errors`` maps it)."""
    try:
        from localchat.cli.app import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    app()
