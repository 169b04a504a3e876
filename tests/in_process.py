"""The CLI run in the test's own process (Typer's runner), answered as a subprocess would be: for
tests whose subject is what a command does, not the process it runs in."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_cli(home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """``localchat ARGS`` with ``home`` as its data directory: exit code, stdout and stderr."""
    from typer.testing import CliRunner

    from localchat.cli.app import app

    done = CliRunner().invoke(app, list(args), input=stdin, env={"LOCALCHAT_HOME": str(home), "COLUMNS": "200"})
    return subprocess.CompletedProcess(list(args), done.exit_code, done.stdout, done.stderr)
