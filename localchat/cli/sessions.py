"""``localchat sessions list|show|rm|export``: the saved sessions, shown and managed."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from localchat.store.saved_sessions import default_store, export_json, export_markdown


def show_list(console: Console) -> None:
    store = default_store()
    summaries = store.list()
    if not summaries:
        console.print(f"no saved sessions in {store.path} (save one with /save NAME in the REPL)")
        return
    table = Table("name", "turns", "model", "backend", "saved", title=str(store.path), title_justify="left")
    for s in summaries:
        table.add_row(s.name, str(s.turns), s.model or "(server default)", s.backend, s.updated)
    console.print(table)


def show_session(console: Console, name: str) -> None:
    from localchat.cli.render import stats_line

    saved = default_store().load(name)
    console.print(f"[bold]{escape(saved.name)}[/bold] · model {escape(saved.model or '(server default)')} · "
                  f"{saved.backend} · saved {saved.updated}")
    if saved.system:
        console.print(f"[cyan]system[/cyan]: {escape(saved.system)}")
    for i, turn in enumerate(saved.turns, 1):
        console.print(f"{i:>3}. [cyan]user[/cyan]: {escape(turn.user)}")
        if turn.reasoning:
            console.print(f"     [cyan]reasoning[/cyan]: {escape(turn.reasoning)}", style="dim")
        console.print(f"     [cyan]assistant[/cyan]: {escape(turn.assistant)}")
        if turn.stats:
            console.print("     " + stats_line(turn.stats), style="dim", markup=False)


def remove_session(console: Console, name: str) -> None:
    default_store().remove(name)
    console.print(f"removed '{escape(name)}'")


def export_session(name: str, fmt: str) -> None:
    saved = default_store().load(name)
    text = export_json(saved) if fmt == "json" else export_markdown(saved)
    sys.stdout.write(text.rstrip("\n") + "\n")
