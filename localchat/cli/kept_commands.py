"""The declarations of the commands over what is kept of conversations: ``sessions`` (saved under a
name) and ``log`` (every conversation, as it happens); each imports its work when it runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from localchat.cli.dispatch import ListsByDefault, OneLineErrors, err_console, out_console, run
from localchat.cli.options import ExportFormat

sessions_app = typer.Typer(help="Saved conversations (/save NAME in the REPL, chat --resume NAME).", cls=OneLineErrors,
                           no_args_is_help=True, rich_markup_mode=None)


@sessions_app.command("list")
def sessions_list() -> None:
    """Saved sessions, newest first."""
    from localchat.cli.sessions import show_list

    run(show_list, console=out_console())


@sessions_app.command("show")
def sessions_show(name: str) -> None:
    """The saved messages of NAME, with each turn's figures."""
    from localchat.cli.sessions import show_session

    run(show_session, console=out_console(), name=name)


@sessions_app.command("rm")
def sessions_rm(name: str) -> None:
    """Delete the saved session NAME and its KV cache."""
    from localchat.cli.sessions import remove_session

    run(remove_session, console=err_console(), name=name)


@sessions_app.command("export")
def sessions_export(
    name: str,
    format: Annotated[ExportFormat, typer.Option("--format", help="Markdown or JSON, on stdout.")] = ExportFormat.md,
) -> None:
    """Print NAME as Markdown or JSON."""
    from localchat.cli.sessions import export_session

    run(export_session, name=name, fmt=format.value)


log_app = typer.Typer(help="Every conversation, kept as it happens: list (the default), search (-q), show, remove.",
                      cls=ListsByDefault, rich_markup_mode=None)


@log_app.command("list")
def log_list(
    query: Annotated[
        Optional[str],
        typer.Option(
            "--query",
            "-q",
            metavar="TEXT",
            help='Search questions, answers and tool results (FTS5: words, "a phrase", pre*, a OR b, NEAR(a b)).',
        ),
    ] = None,
    model: Annotated[
        Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="Only this model's conversations.")
    ] = None,
    since: Annotated[Optional[str], typer.Option(metavar="AGE", help="Only the last 30m, 12h, 2d, 3w.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many lines.")] = 20,
) -> None:
    """The recent conversations, or with -q the turns that match, best first (`localchat log -q …`)."""
    from localchat.cli.log import show_log

    run(show_log, console=out_console(), query=query, model=model, since=since,
        as_json=as_json, limit=limit)


@log_app.command("show")
def log_show(
    conversation: Annotated[
        str, typer.Argument(metavar="ID", help="An id (or its start) from `localchat log`, or a name.")
    ],
) -> None:
    """Every turn of one conversation, in order, with its figures."""
    from localchat.cli.log import show_entry

    run(show_entry, console=out_console(), key=conversation)


@log_app.command("rm")
def log_rm(
    conversation: Annotated[
        Optional[str], typer.Argument(metavar="[ID]", help="An id (or its start), or a name.")
    ] = None,
    older_than: Annotated[
        Optional[str], typer.Option(metavar="AGE", help="Every conversation last kept before 30d, 12h… ago.")
    ] = None,
    everything: Annotated[bool, typer.Option("--all", help="Every conversation.")] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask before removing many (--all, --older-than).")
    ] = False,
) -> None:
    """Remove conversations from the log, with what resuming them needs and their KV caches."""
    from localchat.cli.log import remove_entries

    run(remove_entries, console=err_console(), key=conversation, older_than=older_than,
        everything=everything, yes=yes)
