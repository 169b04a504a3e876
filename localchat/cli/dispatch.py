"""How every command runs: errors become one line and an exit code here and only here.

A ``LocalchatError`` becomes one red line on stderr and its exit code (2 for usage errors, like
Typer's own); Ctrl+C exits 130 and SIGTERM 143 without a traceback. The codes themselves are in
``outcomes``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import typer
from typer.core import TyperCommand, TyperGroup

from localchat.cli import outcomes
from localchat.errors import LocalchatError, TerminationRequested

if TYPE_CHECKING:
    from localchat.cli.terminal import TerminalConsole


def _click_class(name: str) -> type:
    """Click's own exception classes, as the installed Typer has them (it may vendor click)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


ClickUsageError, ClickException = _click_class("UsageError"), _click_class("ClickException")
METAVARS = {int: "N", float: "NUMBER", str: "TEXT", Path: "PATH"}  # instead of Typer's <int range>, <list[str]>


def with_metavars(command: Any) -> Any:
    """Every option that takes a value shows a word for it (``--pin TEXT``, ``--max-tokens N``),
    unless its declaration names one; choices keep their list; an argument shows its name."""
    for param in getattr(command, "params", ()):
        described = getattr(param, "type_descriptor", None)
        if param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()  # PROMPT, NAME, FILE: as the docstrings call them
        if param.param_type_name != "option" or param.metavar is not None or described is None \
                or described.is_choice or getattr(param, "is_flag", False):
            continue
        inner = get_args(described.annotation) if described.is_list else ()
        param.metavar = METAVARS.get(inner[0] if inner else described.annotation)
    return command


def resume_alone(args: list[str]) -> list[str]:
    """``chat --resume`` with no name (at the end of the line, or before another option) as
    ``--resume=``: pick one of the recent conversations (click has no option with an optional value)."""
    out: list[str] = []
    for position, arg in enumerate(args):
        if arg == "--":
            return out + args[position:]
        following = args[position + 1] if position + 1 < len(args) else None
        if arg == "--resume" and (following is None or (following.startswith("-") and following != "-")):
            arg = "--resume="
        out.append(arg)
    return out


class OneLineErrors(TyperGroup):
    """Usage errors as one line (``error: … (see: localchat chat --help)``), exit 2, instead of
    click's usage block; every other outcome as click and Typer decide it."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = resume_alone(list(sys.argv[1:] if args is None else args))
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickUsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `localchat` alone: the help, as click shows it
                exc.show()
                sys.exit(exc.exit_code)
            command = exc.ctx.command_path if exc.ctx else "localchat"
            say_error(f"{exc.format_message()} (see: {command} --help)")
            sys.exit(outcomes.USAGE)
        except typer.Abort:
            sys.exit(outcomes.INTERRUPTED)
        except ClickException as exc:
            say_error(exc.format_message())
            sys.exit(exc.exit_code)
        if code == outcomes.INTERRUPTED:  # Typer's own mapping of a Ctrl+C it caught, silently
            say("interrupted")
        sys.exit(code if isinstance(code, int) else outcomes.OK)

    def get_command(self, ctx, cmd_name):
        return with_metavars(super().get_command(ctx, cmd_name))

    def get_help_option(self, ctx):
        """The group's own ``--help``, unset when a subcommand's help is asked for, is False rather
        than None: Typer coerces a None through pydantic, whose import would cost every
        ``localchat COMMAND --help`` about 0.1 s (see ``scripts/bench_help.py``)."""
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option

    def invoke(self, ctx):
        """Ctrl+C between Typer and a command's ``run`` is the same one line as inside it."""
        with user_errors():
            return super().invoke(ctx)


class ListsByDefault(OneLineErrors):
    """A group whose ``list`` subcommand is the default: ``localchat log -q harbor`` is ``localchat
    log list -q harbor``. The group itself then takes no options, so ``log show --help`` coerces none
    (Typer would load pydantic for them)."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


class DefaultRun(TyperCommand):
    """The ``run`` of a ``RunsByDefault`` group: its help shows the usage a user types
    (``localchat bench [OPTIONS]``), not the name it is reached by."""

    def format_usage(self, ctx, formatter):
        path = ctx.parent.command_path if ctx.parent is not None else ctx.command_path
        formatter.write_usage(path, " ".join(self.collect_usage_pieces(ctx)))


class RunsByDefault(OneLineErrors):
    """A group whose ``run`` subcommand is the default: ``localchat bench --repeat 5`` is ``localchat
    bench run --repeat 5``, and ``bench --help`` shows run's options; ``bench compare A B`` is the
    other subcommand."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


def err_console() -> TerminalConsole:
    """stderr, for errors, notices and progress (Rich is loaded only when something is printed)."""
    from localchat.cli.terminal import console

    return console(stderr=True, soft_wrap=None)


def out_console() -> TerminalConsole:
    """stdout; long lines wrap at words on a terminal, never through a pipe (ids and commands stay whole)."""
    from localchat.cli.terminal import console

    return console(soft_wrap=None)


def say_error(message: str) -> None:
    """One red ``error:`` line on stderr (the message is text, never markup)."""
    from rich.markup import escape

    err_console().print(f"[red]error:[/red] {escape(message)}")


def say(message: str) -> None:
    err_console().print(f"[yellow]{message}[/yellow]")


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except LocalchatError as exc:
        say_error(str(exc))
        raise typer.Exit(exc.exit_code) from None
    except TerminationRequested:
        say("terminated (SIGTERM)")
        raise SystemExit(outcomes.TERMINATED) from None  # past click, which maps a 130 of its own
    except KeyboardInterrupt:
        say("interrupted")
        raise SystemExit(outcomes.INTERRUPTED) from None


def run(command: Callable[..., int | None], **kwargs: Any) -> None:
    """Call a command's work by keyword inside the error mapping, then exit with the code it
    returns. Each command imports its work inside its own function (``--help`` loads none of it);
    that import runs inside the same mapping (``OneLineErrors.invoke``): Ctrl+C there is one line too."""
    with user_errors():
        code = command(**kwargs)
    raise typer.Exit(outcomes.OK if code is None else code)
